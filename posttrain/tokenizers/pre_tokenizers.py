"""Pre-tokenisers (str -> list[str]): cut normalised text into the words a subword model encodes independently.

Merges never cross a word boundary and a word's encoding can be cached. Each class mirrors one Hugging
Face ``tokenizers`` pre-tokeniser of the same name and JSON shape (``PRE_TOKENIZERS``):

- ``ByteLevel``: the GPT-2 regex split
  ``'s|'t|...| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``, then each word's bytes through
  :func:`symbols.bytes_to_unicode`. Example: ``"Hi there"`` -> ``["Hi", "Ġthere"]``.
- ``Split`` with the cl100k regex (GPT-4 style) followed by ``ByteLevel(use_regex=False)``.
- ``Whitespace`` (``\\w+|[^\\w\\s]+``), ``WhitespaceSplit``, ``Metaspace`` (SentencePiece's ``▁``),
  ``BertPreTokenizer`` (whitespace split, every punctuation character its own word), ``Sequence``.

- ``Digits``: numbers cut out of the text, one word per digit with ``individual_digits`` (Llama, DeepSeek:
  "1999" -> ["1", "9", "9", "9"], so every number is spelled with the same ten tokens and stays learnable).

Not handled: offsets (positions in the original text), ``Punctuation``, ``Split`` behaviours
other than ``Isolated``/``Removed`` or with ``invert``: loading such a file raises a ``UserError``.
"""

from __future__ import annotations

import regex

from posttrain.errors import UserError
from posttrain.tokenizers.normalizers import component_from_json, pattern_from_json
from posttrain.tokenizers.symbols import LATIN1_TO_BL, METASPACE, WHITESPACE, bert_regexes, is_bert_punctuation

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
GPT2_LINES_PATTERN = (
    r""" ?\p{L}+|'s|'t|'re|'ve|'m|'ll|'d| ?\p{N}+| ?[^\s\p{L}\p{N}]+"""
    r"""|[^\S\n]*\n|[^\S\n]+(?!\S)|[^\S\n]+"""
)


class ByteLevel:
    """Regex split (GPT-2 by default) then each word's UTF-8 bytes mapped through bytes_to_unicode.

    "Hi there" -> ["Hi", "Ġthere"]; "é" -> ["Ã©"]. With add_prefix_space a leading space is added
    to text that does not start with one."""

    def __init__(
        self,
        add_prefix_space: bool = False,
        use_regex: bool = True,
        pattern: str = GPT2_PATTERN,
        trim_offsets: bool = True,
    ):
        self.add_prefix_space, self.use_regex, self.trim_offsets = add_prefix_space, use_regex, trim_offsets
        self._re = regex.compile(pattern)

    def split(self, text: str) -> list[str]:
        if self.add_prefix_space and not text.startswith(" "):
            text = " " + text
        return self._re.findall(text) if self.use_regex else [text]

    def __call__(self, text: str) -> list[str]:
        t = LATIN1_TO_BL
        return [w.encode("utf-8", "surrogateescape").decode("latin-1").translate(t) for w in self.split(text)]

    def to_json(self) -> dict:
        return {
            "type": "ByteLevel",
            "add_prefix_space": self.add_prefix_space,
            "trim_offsets": self.trim_offsets,
            "use_regex": self.use_regex,
        }


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
                out.append(text[pos : m.start()])
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
        if c in WHITESPACE:
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
        return {
            "type": "Metaspace",
            "replacement": self.replacement,
            "prepend_scheme": self.prepend_scheme,
            "split": self.split,
        }


class Digits:
    """HF ``Digits``: digit runs isolated from the rest; ``individual_digits`` -> one word per digit.

    "ab12c" -> ["ab", "12", "c"]; individual: ["ab", "1", "2", "c"]. A digit is Unicode ``\\p{N}``."""

    def __init__(self, individual_digits: bool = False):
        self.individual_digits = individual_digits
        self._re = regex.compile(r"\p{N}" if individual_digits else r"\p{N}+")

    def __call__(self, text: str) -> list[str]:
        out, pos = [], 0
        for m in self._re.finditer(text):
            if m.start() > pos:
                out.append(text[pos : m.start()])
            out.append(m.group())
            pos = m.end()
        if pos < len(text):
            out.append(text[pos:])
        return out

    def to_json(self) -> dict:
        return {"type": "Digits", "individual_digits": self.individual_digits}


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
    pat, is_re = pattern_from_json(d["pattern"])
    return Split(pat, is_re, d.get("behavior", "Isolated"))


PRE_TOKENIZERS = {
    "ByteLevel": lambda d: ByteLevel(
        d.get("add_prefix_space", False), d.get("use_regex", True), trim_offsets=d.get("trim_offsets", True)
    ),
    "Split": _split_from_json,
    "Whitespace": lambda d: Whitespace(),
    "WhitespaceSplit": lambda d: WhitespaceSplit(),
    "BertPreTokenizer": lambda d: BertPreTokenizer(),
    "Metaspace": lambda d: Metaspace(
        d.get("replacement", METASPACE), d.get("prepend_scheme", "always"), d.get("split", True)
    ),
    "Digits": lambda d: Digits(bool(d.get("individual_digits", False))),
    "Sequence": lambda d: PreTokenizerSequence([pre_tokenizer_from_json(x) for x in d["pretokenizers"]]),
}


def pre_tokenizer_from_json(d: dict | None):
    return component_from_json(d, PRE_TOKENIZERS, "pre_tokenizer")
