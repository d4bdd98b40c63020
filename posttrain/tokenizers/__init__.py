"""Tokenizers: char-level (smallest), BPE, byte-level BPE, WordPiece, Unigram.

``load(path)`` reads any tokenizer file posttrain writes (a Hugging Face ``tokenizer.json`` for the
subword models, a small JSON for the char model) and returns an object satisfying
:class:`posttrain.tokenizers.base.Tokenizer`.
"""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.errors import UserError
from posttrain.tokenizers.base import Tokenizer
from posttrain.tokenizers.bpe import BPEModel, BPETrainer
from posttrain.tokenizers.bytelevel import ByteLevelBPETrainer
from posttrain.tokenizers.char import CharTokenizer
from posttrain.tokenizers.hf_json import load_hf_json
from posttrain.tokenizers.pipeline import SubwordTokenizer
from posttrain.tokenizers.unigram import UnigramModel, UnigramTrainer, sample_encode
from posttrain.tokenizers.wordpiece import WordPieceModel, WordPieceTrainer

# --model name -> trainer class (each has .train(texts) -> SubwordTokenizer)
TRAINERS = {
    "bpe": BPETrainer,
    "byte-bpe": ByteLevelBPETrainer,
    "wordpiece": WordPieceTrainer,
    "unigram": UnigramTrainer,
}

__all__ = [
    "Tokenizer",
    "CharTokenizer",
    "SubwordTokenizer",
    "BPEModel",
    "WordPieceModel",
    "UnigramModel",
    "BPETrainer",
    "ByteLevelBPETrainer",
    "WordPieceTrainer",
    "UnigramTrainer",
    "TRAINERS",
    "sample_encode",
    "load",
]


def load(path: str | Path) -> Tokenizer:
    """Load a tokenizer file (or a checkpoint directory holding ``tokenizer.json``)."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise UserError(f"tokenizer file not found: {p}")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{p}: not a valid tokenizer JSON file ({e})") from None
    if isinstance(data, dict) and data.get("type") == "char":
        return CharTokenizer.from_dict(data, source=p)
    return load_hf_json(data, source=p)  # Hugging Face tokenizer.json (BPE, byte-level BPE, WordPiece, Unigram)
