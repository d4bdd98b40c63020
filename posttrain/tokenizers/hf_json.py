"""Read and write Hugging Face ``tokenizer.json`` for the BPE, WordPiece and Unigram model types.

Key insight: ``tokenizer.json`` is just the pipeline spelled out — ``added_tokens``, ``normalizer``,
``pre_tokenizer``, ``model`` and ``decoder`` — each a ``{"type": ...}`` object. Each type maps to one
class here through a visible dict (``MODELS`` below, the component dicts in :mod:`pretokenize`),
so a file we write loads in ``tokenizers`` and a file ``tokenizers`` writes loads here, and both
encode every text to the same ids.

Not handled (a ``UserError`` names the part): ``WordLevel`` models, ``Precompiled`` normalisers,
BPE dropout. ``post_processor``, ``truncation`` and ``padding`` are read past: by contract
``encode`` adds no special tokens and never pads.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.errors import UserError
from posttrain.tokenizers import pretokenize as P
from posttrain.tokenizers.bpe import BPEModel
from posttrain.tokenizers.pipeline import SubwordTokenizer
from posttrain.tokenizers.unigram import UnigramModel
from posttrain.tokenizers.wordpiece import WordPieceModel

MODELS = {
    "BPE": BPEModel.from_json,
    "WordPiece": WordPieceModel.from_json,
    "Unigram": UnigramModel.from_json,
}


def _kind(model, pre_tokenizer) -> str:
    if model.type == "BPE":
        pts = pre_tokenizer.steps if isinstance(pre_tokenizer, P.PreTokenizerSequence) else [pre_tokenizer]
        return "byte-bpe" if any(isinstance(p, P.ByteLevel) for p in pts) else "bpe"
    return model.type.lower()


def load_hf_json(data: dict, source: str | Path = "tokenizer.json") -> SubwordTokenizer:
    """Build a SubwordTokenizer from a parsed tokenizer.json (``source`` only names it in errors)."""
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise UserError(f"{source}: not a Hugging Face tokenizer.json (no 'model' object)")
    mtype = data["model"].get("type")
    if mtype is None:  # very old files omit the type; guess from the fields present
        m = data["model"]
        mtype = "BPE" if "merges" in m else "WordPiece" if "continuing_subword_prefix" in m else "Unigram"
    if mtype not in MODELS:
        raise UserError(f"{source}: unsupported tokenizer model type {mtype!r} (supported: {', '.join(MODELS)})")
    try:
        model = MODELS[mtype](data["model"])
        normalizer = P.normalizer_from_json(data.get("normalizer"))
        pre_tokenizer = P.pre_tokenizer_from_json(data.get("pre_tokenizer"))
        decoder = P.decoder_from_json(data.get("decoder"))
    except UserError as e:
        raise UserError(f"{source}: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{source}: malformed tokenizer.json ({type(e).__name__}: {e})") from None
    added = [{"id": int(t["id"]), "content": t["content"], "special": bool(t.get("special", False))}
             for t in data.get("added_tokens") or []]
    return SubwordTokenizer(model, normalizer=normalizer, pre_tokenizer=pre_tokenizer, decoder=decoder,
                            added_tokens=added, kind=_kind(model, pre_tokenizer))


def to_hf_json(tok: SubwordTokenizer) -> dict:
    """The tokenizer.json dict for ``tok`` (added tokens written with normalized=false, never stripped)."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": t["id"], "content": t["content"], "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": bool(t.get("special", True))}
            for t in tok.added_tokens
        ],
        "normalizer": tok.normalizer.to_json() if tok.normalizer is not None else None,
        "pre_tokenizer": tok.pre_tokenizer.to_json() if tok.pre_tokenizer is not None else None,
        "post_processor": None,
        "decoder": tok.decoder.to_json() if tok.decoder is not None else None,
        "model": tok.model.to_json(),
    }
