"""Normalisers, pre-tokenisers and decoders: the text <-> "words" stages around a subword model.

Key insight: a subword model never sees raw text. A *normaliser* rewrites the text (NFKC, lower-case,
BERT cleaning), a *pre-tokeniser* cuts it into words the model segments independently (so merges
never cross a word boundary and a word's encoding can be cached), and a *decoder* turns the model's
token strings back into text. Each stage here mirrors one Hugging Face ``tokenizers`` component of
the same name and JSON shape, so a ``tokenizer.json`` round-trips through :mod:`hf_json`:

- ``ByteLevel``: GPT-2's byte -> printable-unicode map (``bytes_to_unicode``: 188 printable bytes map
  to themselves, the other 68 to U+0100.. in order), after the GPT-2 regex split
  ``'s|'t|...| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``.
  Example: ``"Hi there"`` -> ``["Hi", "Ġthere"]`` (space 0x20 -> ``Ġ`` U+0120).
- ``Split`` with the cl100k regex (GPT-4 style) followed by ``ByteLevel(use_regex=False)``.
- ``Whitespace`` (``\\w+|[^\\w\\s]+``), ``WhitespaceSplit``, ``Metaspace`` (SentencePiece's ``▁``),
  ``BertPreTokenizer`` (whitespace split, every punctuation character its own word).
- ``BertNormalizer``: drop control characters, map whitespace to ``' '``, pad CJK ideographs with
  spaces, optional accent stripping (NFD, drop Mn) and lower-casing.

Not handled: offsets (positions in the original text), ``Precompiled`` SentencePiece normalisers,
``Digits``/``Punctuation`` behaviours other than ``Isolated``/``Removed``: loading such a file
raises a ``UserError`` that names the component.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

import regex

from posttrain.errors import UserError

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CL100K_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
PATTERNS = {"gpt2": GPT2_PATTERN, "cl100k": CL100K_PATTERN}
# GPT2_PATTERN over many lines joined into one string, each line ending in its only "\n": the same words as
# GPT2_PATTERN line by line. Only the whitespace alternatives can reach a "\n", so they stop after it, as
# at the end of a line: a run that reaches the "\n" takes it (`\s+(?!\S)` at the end of a string); a run
# followed by \S in its line keeps all but its last character. Letters come first: no two alternatives
# can match at the same position except the whitespace ones, so the order of the others is free.
GPT2_LINES_PATTERN = (r""" ?\p{L}+|'s|'t|'re|'ve|'m|'ll|'d| ?\p{N}+| ?[^\s\p{L}\p{N}]+"""
                      r"""|[^\S\n]*\n|[^\S\n]+(?!\S)|[^\S\n]+""")
METASPACE = "\u2581"  # ▁

# Rust's char::is_whitespace (Unicode White_Space); Python's str.isspace also counts \x1c-\x1f.
_WHITESPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
                        "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map: 33..126, 161..172, 174..255 map to themselves,
    the remaining 68 bytes to chr(256), chr(257), ... in byte order. bytes_to_unicode()[32] == 'Ġ'."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_TO_UNICODE = bytes_to_unicode()
UNICODE_TO_BYTE = {c: b for b, c in BYTE_TO_UNICODE.items()}
# bytes.translate-style table: latin-1 char i -> mapped char, so `s.encode().decode("latin-1").translate(T)`.
_LATIN1_TO_BL = {i: c for i, c in BYTE_TO_UNICODE.items()}


def bytes_to_bl(data: bytes) -> str:
    """b'Hi \\xe4' -> 'HiĠä' (one printable character per byte)."""
    return data.decode("latin-1").translate(_LATIN1_TO_BL)


def bl_to_bytes(text: str) -> bytes:
    """Inverse of bytes_to_bl; characters outside the map are encoded as UTF-8 (HF ByteLevel does the same)."""
    out = bytearray()
    for c in text:
        b = UNICODE_TO_BYTE.get(c)
        if b is None:
            out += c.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)


def is_bert_punctuation(c: str) -> bool:
    """BERT's punctuation: the ASCII non-alphanumeric printables, or any Unicode P* category."""
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def is_chinese_char(c: str) -> bool:
    cp = ord(c)
    return any(a <= cp <= b for a, b in _CJK_RANGES)


def _class_of(member) -> str:
    """A ``re`` character class body holding exactly the code points ``cp`` with ``member[cp]`` true."""
    import numpy as np

    m = np.asarray(member, dtype=np.int8)  # (0x110000,)
    edges = np.flatnonzero(np.diff(np.concatenate(([0], m, [0]))))  # starts and ends (exclusive) of runs
    return "".join(f"\\U{a:08x}" if a == b - 1 else f"\\U{a:08x}-\\U{b - 1:08x}"
                   for a, b in zip(edges[::2].tolist(), edges[1::2].tolist()))


def _runs_of(member) -> str:
    """A pattern for runs of member code points, fast in ``re``: a class of hundreds of ranges is
    scanned range by range, but a class within the BMP is a bitmap, so astral code points get their
    own branch, entered only at an astral character."""
    import numpy as np

    bmp, astral = np.array(member, dtype=bool), np.array(member, dtype=bool)
    bmp[0x10000:] = False
    astral[:0x10000] = False
    pats = [f"[{_class_of(bmp)}]+"] if bmp.any() else []
    if astral.any():
        pats.append(f"(?=[\\U00010000-\\U0010ffff])[{_class_of(astral)}]+")
    return "|".join(pats) or "(?!)"


@lru_cache(maxsize=1)
def bert_regexes() -> dict:
    """BERT's per-character rules as ``re`` patterns, built once from the same predicates as the
    per-character reference (``bert_normalize_slow``, ``bert_pre_tokenize_slow``), so they agree on
    every code point; ~0.3 s, once per process."""
    import re

    import numpy as np

    n = 0x110000
    codes = {k: i for i, k in enumerate("Lu Ll Lt Lm Lo Mn Mc Me Nd Nl No Pc Pd Ps Pe Pi Pf Po Sm Sc Sk So Zs Zl Zp Cc Cf Cs Co Cn".split())}
    cat = np.fromiter(map(codes.__getitem__, map(unicodedata.category, map(chr, range(n)))), dtype=np.int16, count=n)
    in_cats = lambda pred: np.isin(cat, [i for k, i in codes.items() if pred(k)])  # noqa: E731
    cp = np.arange(n)
    is_ws = np.isin(cp, [ord(c) for c in _WHITESPACE])
    ws = "".join(f"\\U{ord(c):08x}" for c in sorted(_WHITESPACE))
    drop = _runs_of(~is_ws & ((cp == 0) | (cp == 0xFFFD) | in_cats(lambda k: k[0] == "C")))
    ascii_punct = ((33 <= cp) & (cp <= 47)) | ((58 <= cp) & (cp <= 64)) | ((91 <= cp) & (cp <= 96)) | ((123 <= cp) & (cp <= 126))
    punct = _class_of(ascii_punct | in_cats(lambda k: k[0] == "P"))  # is_bert_punctuation
    cjk = np.zeros(n, dtype=bool)
    for a, b in _CJK_RANGES:  # is_chinese_char
        cjk[a:b + 1] = True
    mn = _runs_of(in_cats(lambda k: k == "Mn"))
    return {
        "space": re.compile(f"[{ws}]"),
        "drop": re.compile(drop),
        "cjk": re.compile(f"[{_class_of(cjk)}]"),
        "mn": re.compile(mn),
        "words": re.compile(f"[^{ws}{punct}]+|[{punct}]"),
    }


# ------------------------------------------------------------------------------------------------
# Normalisers: str -> str
# ------------------------------------------------------------------------------------------------
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
            text = text.lstrip("".join(_WHITESPACE))
        if self.right:
            text = text.rstrip("".join(_WHITESPACE))
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
        return {"type": "BertNormalizer", "clean_text": self.clean_text, "handle_chinese_chars": self.handle_chinese_chars,
                "strip_accents": self.strip_accents_opt, "lowercase": self.lowercase}


def _pad(m) -> str:
    return " " + m.group() + " "


def bert_normalize_slow(text: str, clean_text=True, handle_chinese_chars=True, strip_accents=True,
                        lowercase=True) -> str:
    """Per-character reference for ``BertNormalizer`` (test oracle)."""
    if clean_text or handle_chinese_chars:
        out = []
        for c in text:
            if clean_text:
                if c in _WHITESPACE:
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


def _pattern_from_json(p: dict) -> tuple[str, bool]:
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
    "Replace": lambda d: Replace(*_pattern_from_json(d["pattern"])[:1], d["content"], _pattern_from_json(d["pattern"])[1]),
    "Prepend": lambda d: Prepend(d["prepend"]),
    "Strip": lambda d: Strip(d.get("strip_left", True), d.get("strip_right", True)),
    "BertNormalizer": lambda d: BertNormalizer(d.get("clean_text", True), d.get("handle_chinese_chars", True),
                                              d.get("strip_accents"), d.get("lowercase", True)),
    "Sequence": lambda d: NormalizerSequence([normalizer_from_json(x) for x in d["normalizers"]]),
}


def _from_json(d: dict | None, table: dict, kind: str):
    """The component a tokenizer.json ``{"type": ...}`` entry describes, built by ``table[type]``; None stays None."""
    if d is None:
        return None
    t = d.get("type")
    if t not in table:
        raise UserError(f"unsupported {kind} {t!r} in tokenizer.json (supported: {', '.join(table)})")
    return table[t](d)


def normalizer_from_json(d: dict | None):
    return _from_json(d, NORMALIZERS, "normalizer")


# ------------------------------------------------------------------------------------------------
# Pre-tokenisers: str -> list[str] (words the model encodes independently)
# ------------------------------------------------------------------------------------------------
class ByteLevel:
    """Regex split (GPT-2 by default) then each word's UTF-8 bytes mapped through bytes_to_unicode.

    "Hi there" -> ["Hi", "Ġthere"]; "é" -> ["Ã©"]. With add_prefix_space a leading space is added
    to text that does not start with one."""

    def __init__(self, add_prefix_space: bool = False, use_regex: bool = True, pattern: str = GPT2_PATTERN,
                 trim_offsets: bool = True):
        self.add_prefix_space, self.use_regex, self.trim_offsets = add_prefix_space, use_regex, trim_offsets
        self._re = regex.compile(pattern)

    def split(self, text: str) -> list[str]:
        if self.add_prefix_space and not text.startswith(" "):
            text = " " + text
        return self._re.findall(text) if self.use_regex else [text]

    def __call__(self, text: str) -> list[str]:
        t = _LATIN1_TO_BL
        return [w.encode("utf-8", "surrogateescape").decode("latin-1").translate(t) for w in self.split(text)]

    def to_json(self) -> dict:
        return {"type": "ByteLevel", "add_prefix_space": self.add_prefix_space, "trim_offsets": self.trim_offsets,
                "use_regex": self.use_regex}


class Split:
    """Regex split with the matches kept as words ("Isolated") or dropped ("Removed"); invert=False only."""

    BEHAVIOURS = ("Isolated", "Removed")

    def __init__(self, pattern: str, is_regex: bool = True, behavior: str = "Isolated"):
        if behavior not in self.BEHAVIOURS:
            raise UserError(f"unsupported Split behavior {behavior!r} in tokenizer.json (supported: Isolated, Removed)")
        self.pattern, self.is_regex, self.behavior = pattern, is_regex, behavior
        self._re = regex.compile(pattern if is_regex else regex.escape(pattern))

    def __call__(self, text: str) -> list[str]:
        if self.behavior == "Removed":
            return [w for w in self._re.split(text) if w]
        out, pos = [], 0
        for m in self._re.finditer(text):
            if m.start() > pos:
                out.append(text[pos:m.start()])
            if m.end() > m.start():
                out.append(m.group())
            pos = m.end()
        if pos < len(text):
            out.append(text[pos:])
        return out

    def to_json(self) -> dict:
        key = "Regex" if self.is_regex else "String"
        return {"type": "Split", "pattern": {key: self.pattern}, "behavior": self.behavior, "invert": False}


class Whitespace:
    """HF ``Whitespace``: ``\\w+|[^\\w\\s]+`` -> "héllo, w_rld" -> ["héllo", ",", "w_rld"]."""

    _re = regex.compile(r"\w+|[^\w\s]+")

    def __call__(self, text: str) -> list[str]:
        return self._re.findall(text)

    def to_json(self) -> dict:
        return {"type": "Whitespace"}


class WhitespaceSplit:
    def __call__(self, text: str) -> list[str]:
        return text.split()

    def to_json(self) -> dict:
        return {"type": "WhitespaceSplit"}


class BertPreTokenizer:
    """Split on whitespace (dropped) and on every punctuation character (kept alone): "a,b  c" -> [a , b c].

    One ``re.findall`` (``bert_regexes()["words"]``); ``bert_pre_tokenize_slow`` is the per-character reference."""

    def __call__(self, text: str) -> list[str]:
        return bert_regexes()["words"].findall(text)

    def to_json(self) -> dict:
        return {"type": "BertPreTokenizer"}


def bert_pre_tokenize_slow(text: str) -> list[str]:
    """Per-character reference for ``BertPreTokenizer`` (test oracle)."""
    out, cur = [], []
    for c in text:
        if c in _WHITESPACE:
            if cur:
                out.append("".join(cur))
                cur = []
        elif is_bert_punctuation(c):
            if cur:
                out.append("".join(cur))
                cur = []
            out.append(c)
        else:
            cur.append(c)
    if cur:
        out.append("".join(cur))
    return out


class Metaspace:
    """SentencePiece style: ' ' -> '▁', prepend '▁' (scheme "always"/"first"), split before each '▁'.

    "hello  world" -> ["▁hello", "▁", "▁world"]."""

    def __init__(self, replacement: str = METASPACE, prepend_scheme: str = "always", split: bool = True):
        if prepend_scheme not in ("always", "first", "never"):
            raise UserError(f"unsupported Metaspace prepend_scheme {prepend_scheme!r}")
        self.replacement, self.prepend_scheme, self.split = replacement, prepend_scheme, split

    def __call__(self, text: str) -> list[str]:
        text = text.replace(" ", self.replacement)
        if self.prepend_scheme != "never" and text and not text.startswith(self.replacement):
            text = self.replacement + text
        if not self.split:
            return [text] if text else []
        r = self.replacement
        parts = text.split(r)
        out = [parts[0]] if parts[0] else []
        out.extend(r + p for p in parts[1:])
        return out

    def to_json(self) -> dict:
        return {"type": "Metaspace", "replacement": self.replacement, "prepend_scheme": self.prepend_scheme,
                "split": self.split}


class PreTokenizerSequence:
    def __init__(self, steps: list):
        self.steps = steps

    def __call__(self, text: str) -> list[str]:
        words = [text]
        for s in self.steps:
            words = [w for x in words for w in s(x)]
        return words

    def to_json(self) -> dict:
        return {"type": "Sequence", "pretokenizers": [s.to_json() for s in self.steps]}


def _split_from_json(d: dict) -> Split:
    if d.get("invert"):
        raise UserError("unsupported Split pre-tokenizer with invert=true in tokenizer.json")
    pat, is_re = _pattern_from_json(d["pattern"])
    return Split(pat, is_re, d.get("behavior", "Isolated"))


PRE_TOKENIZERS = {
    "ByteLevel": lambda d: ByteLevel(d.get("add_prefix_space", False), d.get("use_regex", True),
                                     trim_offsets=d.get("trim_offsets", True)),
    "Split": _split_from_json,
    "Whitespace": lambda d: Whitespace(),
    "WhitespaceSplit": lambda d: WhitespaceSplit(),
    "BertPreTokenizer": lambda d: BertPreTokenizer(),
    "Metaspace": lambda d: Metaspace(d.get("replacement", METASPACE), d.get("prepend_scheme", "always"),
                                     d.get("split", True)),
    "Sequence": lambda d: PreTokenizerSequence([pre_tokenizer_from_json(x) for x in d["pretokenizers"]]),
}


def pre_tokenizer_from_json(d: dict | None):
    return _from_json(d, PRE_TOKENIZERS, "pre_tokenizer")


# ------------------------------------------------------------------------------------------------
# Decoders: list[str] (token strings) -> list[str] (pieces joined by the caller)
# ------------------------------------------------------------------------------------------------
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
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
                 (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
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
                t = t[len(self.prefix):] if t.startswith(self.prefix) else " " + t
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
        return {"type": "Metaspace", "replacement": self.replacement, "prepend_scheme": self.prepend_scheme,
                "split": self.split}


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
    "Replace": lambda d: ReplaceDecoder(*_pattern_from_json(d["pattern"])[:1], d["content"], _pattern_from_json(d["pattern"])[1]),
    "Sequence": lambda d: DecoderSequence([decoder_from_json(x) for x in d["decoders"]]),
}


def decoder_from_json(d: dict | None):
    return _from_json(d, DECODERS, "decoder")
