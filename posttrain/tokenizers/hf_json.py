"""Read Hugging Face ``tokenizer.json`` for the BPE, WordPiece and Unigram model types (writing is
``SubwordTokenizer.to_hf_dict``: every stage writes its own JSON).

Key insight: ``tokenizer.json`` is just the pipeline spelled out — ``added_tokens``, ``normalizer``,
``pre_tokenizer``, ``model`` and ``decoder`` — each a ``{"type": ...}`` object. Each type maps to one
class here through a visible dict (``MODELS`` below, ``NORMALIZERS``, ``PRE_TOKENIZERS`` and ``DECODERS``
in :mod:`normalizers`, :mod:`pre_tokenizers` and :mod:`decoders`),
so a file we write loads in ``tokenizers`` and a file ``tokenizers`` writes loads here, and both
encode every text to the same ids.

Not handled (a ``UserError`` names the part): ``WordLevel`` models, ``Precompiled`` normalisers,
BPE dropout. ``post_processor``, ``truncation`` and ``padding`` are read past: by contract
``encode`` adds no special tokens and never pads.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.errors import UserError
from posttrain.tokenizers.bpe import BPEModel
from posttrain.tokenizers.decoders import decoder_from_json
from posttrain.tokenizers.normalizers import normalizer_from_json
from posttrain.tokenizers.pipeline import SubwordTokenizer
from posttrain.tokenizers.pre_tokenizers import ByteLevel, PreTokenizerSequence, pre_tokenizer_from_json
from posttrain.tokenizers.unigram import UnigramModel
from posttrain.tokenizers.wordpiece import WordPieceModel

MODELS = {"BPE": BPEModel.from_json, "WordPiece": WordPieceModel.from_json, "Unigram": UnigramModel.from_json}


def _kind(model, pre_tokenizer) -> str:
    if model.type == "BPE":
        pts = pre_tokenizer.steps if isinstance(pre_tokenizer, PreTokenizerSequence) else [pre_tokenizer]
        return "byte-bpe" if any(isinstance(p, ByteLevel) for p in pts) else "bpe"
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
        normalizer = normalizer_from_json(data.get("normalizer"))
        pre_tokenizer = pre_tokenizer_from_json(data.get("pre_tokenizer"))
        decoder = decoder_from_json(data.get("decoder"))
    except UserError as e:
        raise UserError(f"{source}: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{source}: malformed tokenizer.json ({type(e).__name__}: {e})") from None
    added = [
        {"id": int(t["id"]), "content": t["content"], "special": bool(t.get("special", False))}
        for t in data.get("added_tokens") or []
    ]
    return SubwordTokenizer(
        model,
        normalizer=normalizer,
        pre_tokenizer=pre_tokenizer,
        decoder=decoder,
        added_tokens=added,
        kind=_kind(model, pre_tokenizer),
    )
