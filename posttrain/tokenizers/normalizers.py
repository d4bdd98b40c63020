"""Normalisers (str -> str): the first stage of a subword tokenizer, rewriting the text before it is cut.

Each class mirrors one Hugging Face ``tokenizers`` normaliser of the same name and JSON shape
(``NORMALIZERS`` maps a ``"type"`` to its constructor, so ``tokenizer.json`` round-trips through
:mod:`hf_json`): ``NFC``/``NFD``/``NFKC``/``NFKD``, ``Lowercase``, ``StripAccents``, ``Replace``,
``Prepend``, ``Strip``, ``Sequence`` and ``BertNormalizer`` (drop control characters, map whitespace
to ``' '``, pad CJK ideographs with spaces, optional accent stripping (NFD, drop Mn) and lower-casing).

Not handled: ``Precompiled`` SentencePiece normalisers (loading one raises a ``UserError`` naming it).
"""

from __future__ import annotations

import unicodedata

import regex

from posttrain.errors import UserError
from posttrain.tokenizers.symbols import WHITESPACE, bert_regexes, is_chinese_char


class UnicodeNormalizer:
    def __init__(self, form: str):
        self.form = form

    def __call__(self, text: str) -> str:
        return unicodedata.normalize(self.form, text)

    def to_json(self) -> dict:
        return {"type": self.form}


class Lowercase:
    def __call__(self, text: str) -> str:
        return text.lower()

    def to_json(self) -> dict:
        return {"type": "Lowercase"}


class StripAccents:
    """Drop nonspacing marks (Mn); meant to follow NFD/NFKD as in HF."""

    def __call__(self, text: str) -> str:
        return "".join(c for c in text if unicodedata.category(c) != "Mn")

    def to_json(self) -> dict:
        return {"type": "StripAccents"}


class Replace:
    def __init__(self, pattern: str, content: str, is_regex: bool = False):
        self.pattern, self.content, self.is_regex = pattern, content, is_regex
        self._re = regex.compile(pattern) if is_regex else None

    def __call__(self, text: str) -> str:
        if self._re is not None:
            return self._re.sub(lambda m: self.content, text)
        return text.replace(self.pattern, self.content)

    def to_json(self) -> dict:
        key = "Regex" if self.is_regex else "String"
        return {"type": "Replace", "pattern": {key: self.pattern}, "content": self.content}


class Prepend:
    def __init__(self, prepend: str):
        self.prepend = prepend

    def __call__(self, text: str) -> str:
        return self.prepend + text if text else text

    def to_json(self) -> dict:
        return {"type": "Prepend", "prepend": self.prepend}


class Strip:
    def __init__(self, left: bool = True, right: bool = True):
        self.left, self.right = left, right

    def __call__(self, text: str) -> str:
        if self.left:
            text = text.lstrip("".join(WHITESPACE))
        if self.right:
            text = text.rstrip("".join(WHITESPACE))
        return text

    def to_json(self) -> dict:
        return {"type": "Strip", "strip_left": self.left, "strip_right": self.right}


class BertNormalizer:
    """BERT cleaning: drop NUL/U+FFFD/control (category C* except \\t\\n\\r), whitespace -> ' ',
    ' 中 ' around CJK ideographs, then NFD + drop Mn (strip_accents; default = lowercase), then lower().

    Each rule is one ``re`` substitution over the whole text (``bert_regexes``), not a Python loop per
    character; ``bert_normalize_slow`` is the per-character reference."""

    def __init__(self, clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True):
        self.clean_text, self.handle_chinese_chars = clean_text, handle_chinese_chars
        self.strip_accents_opt, self.lowercase = strip_accents, lowercase
        self.strip_accents = lowercase if strip_accents is None else strip_accents

    def __call__(self, text: str) -> str:
        r = bert_regexes()
        if self.clean_text:  # whitespace first: \t \n \r are controls too, but become spaces
            text = r["drop"].sub("", r["space"].sub(" ", text))
        if self.handle_chinese_chars:
            text = r["cjk"].sub(_pad, text)
        if self.strip_accents:
            text = r["mn"].sub("", unicodedata.normalize("NFD", text))
        if self.lowercase:
            text = text.lower()
        return text

    def to_json(self) -> dict:
        return {
            "type": "BertNormalizer",
            "clean_text": self.clean_text,
            "handle_chinese_chars": self.handle_chinese_chars,
            "strip_accents": self.strip_accents_opt,
            "lowercase": self.lowercase,
        }


def _pad(m) -> str:
    return " " + m.group() + " "


def bert_normalize_slow(
    text: str, clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True
) -> str:
    """Per-character reference for ``BertNormalizer`` (test oracle)."""
    if clean_text or handle_chinese_chars:
        out = []
        for c in text:
            if clean_text:
                if c in WHITESPACE:
                    out.append(" ")
                    continue
                if c == "\x00" or c == "\ufffd" or unicodedata.category(c)[0] == "C":
                    continue
            if handle_chinese_chars and is_chinese_char(c):
                out.append(" " + c + " ")
            else:
                out.append(c)
        text = "".join(out)
    if strip_accents:
        text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    if lowercase:
        text = text.lower()
    return text


class NormalizerSequence:
    def __init__(self, steps: list):
        self.steps = steps

    def __call__(self, text: str) -> str:
        for s in self.steps:
            text = s(text)
        return text

    def to_json(self) -> dict:
        return {"type": "Sequence", "normalizers": [s.to_json() for s in self.steps]}


def pattern_from_json(p: dict) -> tuple[str, bool]:
    if "Regex" in p:
        return p["Regex"], True
    return p["String"], False


NORMALIZERS = {
    "NFC": lambda d: UnicodeNormalizer("NFC"),
    "NFD": lambda d: UnicodeNormalizer("NFD"),
    "NFKC": lambda d: UnicodeNormalizer("NFKC"),
    "NFKD": lambda d: UnicodeNormalizer("NFKD"),
    "Lowercase": lambda d: Lowercase(),
    "StripAccents": lambda d: StripAccents(),
    "Replace": lambda d: Replace(
        *pattern_from_json(d["pattern"])[:1], d["content"], pattern_from_json(d["pattern"])[1]
    ),
    "Prepend": lambda d: Prepend(d["prepend"]),
    "Strip": lambda d: Strip(d.get("strip_left", True), d.get("strip_right", True)),
    "BertNormalizer": lambda d: BertNormalizer(
        d.get("clean_text", True), d.get("handle_chinese_chars", True), d.get("strip_accents"), d.get("lowercase", True)
    ),
    "Sequence": lambda d: NormalizerSequence([normalizer_from_json(x) for x in d["normalizers"]]),
}


def component_from_json(d: dict | None, table: dict, kind: str):
    """The component a tokenizer.json ``{"type": ...}`` entry describes, built by ``table[type]``; None stays None."""
    if d is None:
        return None
    t = d.get("type")
    if t not in table:
        raise UserError(f"unsupported {kind} {t!r} in tokenizer.json (supported: {', '.join(table)})")
    return table[t](d)


def normalizer_from_json(d: dict | None):
    return component_from_json(d, NORMALIZERS, "normalizer")
