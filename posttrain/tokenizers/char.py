"""Character-level tokenizer: one id per character of a fixed alphabet, plus special tokens.

The smallest tokenizer that works end to end (the embedded arithmetic task needs 13 characters).
Ids: ``<pad>``=0, ``<bos>``=1, ``<eos>``=2, ``<unk>``=3, then the alphabet in the given order.
A character outside the alphabet encodes to ``<unk>`` (or raises, with ``strict=True``); the data
loaders count those (``unknown_chars``) and warn or fail (see :mod:`posttrain.data.checks`).

Saved as JSON ``{"type": "char", "alphabet": ..., "special_tokens": [...]}``; it is not a Hugging Face
``tokenizer.json`` model type (HF has no character model): :func:`posttrain.tokenizers.load` reads it.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.data.io import atomic_write_json
from posttrain.errors import UserError

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")


class CharTokenizer:
    type = "char"

    def __init__(self, alphabet: str, strict: bool = False):
        if len(set(alphabet)) != len(alphabet):
            raise UserError("char tokenizer alphabet has repeated characters")
        if not alphabet:
            raise UserError("char tokenizer alphabet is empty")
        self.alphabet = alphabet
        self.strict = strict
        self._itos = list(SPECIALS) + list(alphabet)
        self._stoi = {t: i for i, t in enumerate(self._itos)}

    # --- protocol -----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self._itos)

    pad_id = property(lambda self: 0)
    bos_id = property(lambda self: 1)
    eos_id = property(lambda self: 2)
    unk_id = property(lambda self: 3)

    def encode(self, text: str) -> list[int]:
        """ "12+3" -> [5, 6, 14, 7] for alphabet "0123456789+-=" (digit d -> 4 + d)."""
        stoi, unk = self._stoi, self.unk_id
        if self.strict:
            bad = [c for c in text if c not in stoi or c in SPECIALS]
            if bad:
                raise UserError(f"character {bad[0]!r} is not in the tokenizer alphabet {self.alphabet!r}")
        return [stoi.get(c, unk) for c in text]

    def unknown_chars(self, text: str) -> list[str]:
        """The characters of ``text`` that encode to ``<unk>`` (in order, repeats kept)."""
        stoi = self._stoi
        return [c for c in text if c not in stoi]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        n_special = len(SPECIALS)
        out = []
        for i in ids:
            i = int(i)
            if i < n_special:
                if not skip_special_tokens:
                    out.append(self._itos[i])
            elif i < len(self._itos):
                out.append(self._itos[i])
        return "".join(out)

    def token_to_id(self, token: str) -> int | None:
        return self._stoi.get(token)

    def id_to_token(self, idx: int) -> str | None:
        return self._itos[idx] if 0 <= idx < len(self._itos) else None

    def save(self, path: str | Path) -> None:
        atomic_write_json(path, self.to_dict())

    # --- serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"type": "char", "alphabet": self.alphabet, "special_tokens": list(SPECIALS), "strict": self.strict}

    @classmethod
    def from_dict(cls, d: dict, source: str | Path | None = None) -> "CharTokenizer":
        """Build from the saved JSON; a malformed file is a one-line UserError naming ``source``."""
        where = f"{source}: " if source is not None else ""
        if not isinstance(d, dict):
            raise UserError(f"{where}char tokenizer file must hold a JSON object, got {type(d).__name__}")
        specials = d.get("special_tokens", list(SPECIALS))
        if not isinstance(specials, list) or tuple(specials) != SPECIALS:
            raise UserError(f"{where}char tokenizer file has unexpected special tokens")
        alphabet = d.get("alphabet")
        if alphabet is None:
            raise UserError(f"{where}char tokenizer file has no 'alphabet' (the string of characters it encodes)")
        if not isinstance(alphabet, str):
            raise UserError(f"{where}char tokenizer 'alphabet' must be a string, got {type(alphabet).__name__}")
        strict = d.get("strict", False)
        if not isinstance(strict, bool):
            raise UserError(f"{where}char tokenizer 'strict' must be true or false, got {strict!r}")
        try:
            return cls(alphabet, strict=strict)
        except UserError as e:
            raise UserError(f"{where}{e}") from None

    def __repr__(self) -> str:
        return f"CharTokenizer(alphabet={self.alphabet!r})"
