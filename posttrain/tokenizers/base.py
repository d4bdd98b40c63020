"""The Tokenizer protocol every tokenizer in posttrain satisfies (char, BPE, byte-level BPE, WordPiece, Unigram).

Trainers and the sampler only use this surface: ``encode`` (text -> ids, no special tokens added),
``decode`` (ids -> text; special tokens dropped unless asked), the special-token ids, ``vocab_size``
and ``save``. Every tokenizer saves to a single JSON file (``tokenizer.json``) that
:func:`posttrain.tokenizers.load` reads back, whatever its model type.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    @property
    def vocab_size(self) -> int: ...

    @property
    def pad_id(self) -> int | None: ...

    @property
    def bos_id(self) -> int | None: ...

    @property
    def eos_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...

    def id_to_token(self, idx: int) -> str | None: ...

    def save(self, path: str | Path) -> None: ...
