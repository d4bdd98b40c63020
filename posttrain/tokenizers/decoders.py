"""Decoders (list[str] -> list[str]): turn a subword model's token strings back into text pieces.

Each class mirrors one Hugging Face ``tokenizers`` decoder of the same name and JSON shape (``DECODERS``):
``ByteLevel`` (characters back to bytes, then UTF-8), ``BPEDecoder`` (word-final suffix -> space),
``WordPiece`` (``##`` joins, optional cleanup of spaces before punctuation), ``Metaspace``,
``ByteFallback`` (runs of ``<0xNN>`` tokens -> their UTF-8 text), ``Fuse``, ``Strip``, ``Replace``, ``Sequence``.
The caller joins the pieces.

Not handled: ``CTC`` decoders.
"""

from __future__ import annotations

import regex

from posttrain.tokenizers.normalizers import Replace, component_from_json, pattern_from_json
from posttrain.tokenizers.symbols import METASPACE, bl_to_bytes


class ByteLevelDecoder:
    """Join the tokens, map each character back to its byte, decode UTF-8 (invalid bytes -> U+FFFD)."""

    def decode_bytes(self, tokens: list[str]) -> bytes:
        return bl_to_bytes("".join(tokens))

    def __call__(self, tokens: list[str]) -> list[str]:
        return [self.decode_bytes(tokens).decode("utf-8", "replace")]

    def to_json(self) -> dict:
        return {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}


class BPEDecoder:
    """Word-final suffix becomes a space: ["lo", "w</w>", "er</w>"] -> "low er"."""

    def __init__(self, suffix: str = "</w>"):
        self.suffix = suffix

    def __call__(self, tokens: list[str]) -> list[str]:
        n = len(tokens)
        return [t.replace(self.suffix, "" if i == n - 1 else " ") for i, t in enumerate(tokens)]

    def to_json(self) -> dict:
        return {"type": "BPEDecoder", "suffix": self.suffix}


def _wp_cleanup(s: str) -> str:
    for a, b in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" do not", " don't"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        s = s.replace(a, b)
    return s


class WordPieceDecoder:
    """["un", "##aff", "##able", "x"] -> "unaffable x"; cleanup removes spaces before punctuation."""

    def __init__(self, prefix: str = "##", cleanup: bool = True):
        self.prefix, self.cleanup = prefix, cleanup

    def __call__(self, tokens: list[str]) -> list[str]:
        out = []
        for i, t in enumerate(tokens):
            if i != 0:
                t = t[len(self.prefix) :] if t.startswith(self.prefix) else " " + t
            out.append(_wp_cleanup(t) if self.cleanup else t)
        return out

    def to_json(self) -> dict:
        return {"type": "WordPiece", "prefix": self.prefix, "cleanup": self.cleanup}


class MetaspaceDecoder:
    """'▁' -> ' ', except that the first token loses its '▁'s (the prepended space)."""

    def __init__(self, replacement: str = METASPACE, prepend_scheme: str = "always", split: bool = True):
        self.replacement, self.prepend_scheme, self.split = replacement, prepend_scheme, split

    def __call__(self, tokens: list[str]) -> list[str]:
        r = self.replacement
        out = []
        for i, t in enumerate(tokens):
            if i == 0 and self.prepend_scheme != "never":
                out.append(t.replace(r, ""))
            else:
                out.append(t.replace(r, " "))
        return out

    def to_json(self) -> dict:
        return {
            "type": "Metaspace",
            "replacement": self.replacement,
            "prepend_scheme": self.prepend_scheme,
            "split": self.split,
        }


_BYTE_TOKEN = regex.compile(r"<0x([0-9A-F]{2})>")


class ByteFallbackDecoder:
    """Runs of <0xNN> tokens become the UTF-8 text of those bytes (U+FFFD per invalid byte)."""

    def __call__(self, tokens: list[str]) -> list[str]:
        out, buf = [], bytearray()
        for t in tokens:
            m = _BYTE_TOKEN.fullmatch(t) if len(t) == 6 else None
            if m:
                buf.append(int(m.group(1), 16))
                continue
            if buf:
                out.extend(_decode_bytes_hf(bytes(buf)))
                buf = bytearray()
            out.append(t)
        if buf:
            out.extend(_decode_bytes_hf(bytes(buf)))
        return out

    def to_json(self) -> dict:
        return {"type": "ByteFallback"}


def _decode_bytes_hf(b: bytes) -> list[str]:
    try:
        return [b.decode("utf-8")]
    except UnicodeDecodeError:
        return ["\ufffd"] * len(b)  # HF: one replacement character per byte of an invalid run


class FuseDecoder:
    def __call__(self, tokens: list[str]) -> list[str]:
        return ["".join(tokens)]

    def to_json(self) -> dict:
        return {"type": "Fuse"}


class StripDecoder:
    def __init__(self, content: str = " ", start: int = 0, stop: int = 0):
        self.content, self.start, self.stop = content, start, stop

    def __call__(self, tokens: list[str]) -> list[str]:
        out = []
        for t in tokens:
            s = 0
            while s < self.start and s < len(t) and t[s] == self.content:
                s += 1
            e = len(t)
            k = 0
            while k < self.stop and e > s and t[e - 1] == self.content:
                e -= 1
                k += 1
            out.append(t[s:e])
        return out

    def to_json(self) -> dict:
        return {"type": "Strip", "content": self.content, "start": self.start, "stop": self.stop}


class ReplaceDecoder(Replace):
    def __call__(self, tokens: list[str]) -> list[str]:  # type: ignore[override]
        return [Replace.__call__(self, t) for t in tokens]


class DecoderSequence:
    def __init__(self, steps: list):
        self.steps = steps

    def __call__(self, tokens: list[str]) -> list[str]:
        for s in self.steps:
            tokens = s(tokens)
        return tokens

    def to_json(self) -> dict:
        return {"type": "Sequence", "decoders": [s.to_json() for s in self.steps]}


DECODERS = {
    "ByteLevel": lambda d: ByteLevelDecoder(),
    "BPEDecoder": lambda d: BPEDecoder(d.get("suffix", "</w>")),
    "WordPiece": lambda d: WordPieceDecoder(d.get("prefix", "##"), d.get("cleanup", True)),
    "Metaspace": lambda d: MetaspaceDecoder(d.get("replacement", METASPACE), d.get("prepend_scheme", "always")),
    "ByteFallback": lambda d: ByteFallbackDecoder(),
    "Fuse": lambda d: FuseDecoder(),
    "Strip": lambda d: StripDecoder(d.get("content", " "), d.get("start", 0), d.get("stop", 0)),
    "Replace": lambda d: ReplaceDecoder(
        *pattern_from_json(d["pattern"])[:1], d["content"], pattern_from_json(d["pattern"])[1]
    ),
    "Sequence": lambda d: DecoderSequence([decoder_from_json(x) for x in d["decoders"]]),
}


def decoder_from_json(d: dict | None):
    return component_from_json(d, DECODERS, "decoder")
