"""The fixed symbol tables the tokenizer components and models share, each defined once.

- GPT-2's byte -> printable-unicode map (``bytes_to_unicode``: 188 printable bytes map to themselves,
  the other 68 to U+0100.. in order) and its inverse: byte-level BPE shows each byte as one character
  (space 0x20 -> ``Ġ`` U+0120), so ``tokenizer.json`` stays printable.
- ``BYTE_TOKENS``: the 256 ``<0xNN>`` byte-fallback tokens (BPE) / pieces (Unigram).
- ``METASPACE`` (``▁``, SentencePiece's visible space) and ``WHITESPACE`` (Rust's ``char::is_whitespace``).
- BERT's character classes (punctuation, CJK ideographs) as predicates and, built once from the same
  predicates, as ``re`` patterns (``bert_regexes``) for the fast BERT normaliser and pre-tokeniser.

Not handled: nothing here depends on a model; the components live in :mod:`normalizers`,
:mod:`pre_tokenizers` and :mod:`decoders`.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

import numpy as np

METASPACE = "\u2581"  # ▁
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]  # byte fallback: byte b is the token BYTE_TOKENS[b]

# Rust's char::is_whitespace (Unicode White_Space); Python's str.isspace also counts \x1c-\x1f.
WHITESPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


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
LATIN1_TO_BL = {i: c for i, c in BYTE_TO_UNICODE.items()}


def bytes_to_bl(data: bytes) -> str:
    """b'Hi \\xe4' -> 'HiĠä' (one printable character per byte)."""
    return data.decode("latin-1").translate(LATIN1_TO_BL)


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


CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B920, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def is_chinese_char(c: str) -> bool:
    cp = ord(c)
    return any(a <= cp <= b for a, b in CJK_RANGES)


def _class_of(member) -> str:
    """A ``re`` character class body holding exactly the code points ``cp`` with ``member[cp]`` true."""
    m = np.asarray(member, dtype=np.int8)  # (0x110000,)
    edges = np.flatnonzero(np.diff(np.concatenate(([0], m, [0]))))  # starts and ends (exclusive) of runs
    return "".join(
        f"\\U{a:08x}" if a == b - 1 else f"\\U{a:08x}-\\U{b - 1:08x}"
        for a, b in zip(edges[::2].tolist(), edges[1::2].tolist())
    )


def _runs_of(member) -> str:
    """A pattern for runs of member code points, fast in ``re``: a class of hundreds of ranges is
    scanned range by range, but a class within the BMP is a bitmap, so astral code points get their
    own branch, entered only at an astral character."""
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
    n = 0x110000
    codes = {
        k: i
        for i, k in enumerate(
            "Lu Ll Lt Lm Lo Mn Mc Me Nd Nl No Pc Pd Ps Pe Pi Pf Po Sm Sc Sk So Zs Zl Zp Cc Cf Cs Co Cn".split()
        )
    }
    cat = np.fromiter(map(codes.__getitem__, map(unicodedata.category, map(chr, range(n)))), dtype=np.int16, count=n)
    in_cats = lambda pred: np.isin(cat, [i for k, i in codes.items() if pred(k)])  # noqa: E731
    cp = np.arange(n)
    is_ws = np.isin(cp, [ord(c) for c in WHITESPACE])
    ws = "".join(f"\\U{ord(c):08x}" for c in sorted(WHITESPACE))
    drop = _runs_of(~is_ws & ((cp == 0) | (cp == 0xFFFD) | in_cats(lambda k: k[0] == "C")))
    ascii_punct = (
        ((33 <= cp) & (cp <= 47)) | ((58 <= cp) & (cp <= 64)) | ((91 <= cp) & (cp <= 96)) | ((123 <= cp) & (cp <= 126))
    )
    punct = _class_of(ascii_punct | in_cats(lambda k: k[0] == "P"))  # is_bert_punctuation
    cjk = np.zeros(n, dtype=bool)
    for a, b in CJK_RANGES:  # is_chinese_char
        cjk[a : b + 1] = True
    mn = _runs_of(in_cats(lambda k: k == "Mn"))
    return {
        "space": re.compile(f"[{ws}]"),
        "drop": re.compile(drop),
        "cjk": re.compile(f"[{_class_of(cjk)}]"),
        "mn": re.compile(mn),
        "words": re.compile(f"[^{ws}{punct}]+|[{punct}]"),
    }
