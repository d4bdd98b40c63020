"""Byte-level BPE (GPT-2/GPT-4 family): BPE over UTF-8 bytes, so no text is ever out of vocabulary.

Key insight: run BPE on bytes instead of characters. The 256 byte values form the initial
vocabulary, so any string — any *byte* string — is encodable and ``decode(encode(s)) == s`` exactly.
To keep tokens printable in ``tokenizer.json``, each byte is shown as one character through GPT-2's
``bytes_to_unicode`` map (space -> ``Ġ``, newline -> ``Ċ``); see :mod:`symbols`.

Pre-tokenisation is a regex that keeps merges inside letter runs, digit runs and punctuation runs:
GPT-2's (``" ?\\p{L}+"`` etc., a leading space glued to the word) or cl100k's (GPT-4: digits in
groups of <= 3, case-insensitive contractions, newlines kept apart). Training and merge replay are
:mod:`bpe`'s, with no end-of-word suffix.

Bytes that are not valid UTF-8: ``encode_bytes``/``decode_bytes`` on the tokenizer round-trip them
(``surrogateescape`` carries each such byte through the regex as a lone surrogate).

:func:`byte_tokenizer` is the case with no merges: one token per byte, nothing to train.

Not handled: ``add_prefix_space`` when training (supported when loading a file).
"""

from __future__ import annotations

from dataclasses import dataclass

import regex

from posttrain.errors import UserError
from posttrain.tokenizers.bpe import BPEModel, build_vocab, train_merges
from posttrain.tokenizers.corpus import JoinedWords, count_words
from posttrain.tokenizers.decoders import ByteLevelDecoder
from posttrain.tokenizers.merges import check_vocab_size
from posttrain.tokenizers.pipeline import SubwordTokenizer, special_added_tokens
from posttrain.tokenizers.pre_tokenizers import GPT2_LINES_PATTERN, PATTERNS, ByteLevel, PreTokenizerSequence, Split
from posttrain.tokenizers.symbols import BYTE_TO_UNICODE, LATIN1_TO_BL


def pre_tokenizer_for(pattern: str):
    """'gpt2' -> ByteLevel (its own regex); 'cl100k' -> Sequence[Split(cl100k), ByteLevel(use_regex=False)]."""
    if pattern == "gpt2":
        return ByteLevel(add_prefix_space=False)
    if pattern in PATTERNS:
        return PreTokenizerSequence(
            [Split(PATTERNS[pattern], True, "Isolated"), ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    raise UserError(f"unknown pre-tokenizer pattern {pattern!r}; choose from {', '.join(PATTERNS)}")


def byte_tokenizer(special_tokens: tuple[str, ...] = ("<pad>", "<bos>", "<eos>")) -> SubwordTokenizer:
    """The byte-level tokenizer with no merges: the special tokens, then one token per byte value (259 ids by default).

    Any text is encodable and ``decode(encode(s)) == s``; an ASCII character is one token, any other character its
    UTF-8 bytes: ``encode("ab") -> [100, 101]`` (byte 97 after 3 specials), ``encode("é") -> two ids``. What a fresh
    model trained on the user's own data uses when no ``--tokenizer`` is given (``posttrain.tasks.files``).
    """
    specials = list(special_tokens)
    vocab = build_vocab(specials, [BYTE_TO_UNICODE[b] for b in range(256)], [], len(specials) + 256)
    return SubwordTokenizer(
        BPEModel(vocab, []),
        pre_tokenizer=pre_tokenizer_for("gpt2"),
        decoder=ByteLevelDecoder(),
        added_tokens=special_added_tokens(specials),
        kind="byte-bpe",
    )


@dataclass
class ByteLevelBPETrainer:
    """Byte-level BPE trainer; ``pattern`` is 'gpt2' or 'cl100k'."""

    vocab_size: int = 8000
    special_tokens: tuple[str, ...] = ("<pad>", "<bos>", "<eos>")
    min_frequency: int = 1
    pattern: str = "gpt2"
    workers: int | None = None

    kind = "byte-bpe"
    keep_bytes = True
    keep_newlines = True

    def words_fn(self):
        """Raw regex words (byte mapping is applied once per distinct word, after counting); for 'gpt2',
        batches of lines are split by one regex pass (``corpus.JoinedWords``)."""
        if self.pattern == "gpt2":
            return JoinedWords(
                ByteLevel(add_prefix_space=False).split, regex_findall(GPT2_LINES_PATTERN), sep="", lines=True
            )
        return regex_findall(PATTERNS[self.pattern]) if self.pattern in PATTERNS else pre_tokenizer_for(self.pattern)

    def train(self, texts, log=None):
        raw = count_words(texts, self.words_fn(), workers=self.workers)
        return self.train_from_counts(raw, log=log)

    def train_from_counts(self, raw_word_counts: dict[str, int], log=None):
        """``raw_word_counts``: words as the regex cut them (before the byte map)."""
        if not raw_word_counts:
            raise UserError("cannot train byte-level BPE on an empty corpus")
        t = LATIN1_TO_BL
        wc = {
            w.encode("utf-8", "surrogateescape").decode("latin-1").translate(t): c for w, c in raw_word_counts.items()
        }
        specials = list(self.special_tokens)
        alphabet = [BYTE_TO_UNICODE[b] for b in range(256)]
        n = check_vocab_size(self.vocab_size, len(specials), 256, "byte-bpe")
        alphabet, merges = train_merges(wc, n, min_frequency=self.min_frequency, alphabet=alphabet, log=log)
        vocab = build_vocab(specials, alphabet, merges, self.vocab_size)
        if log:
            log(f"byte-bpe: {len(wc)} distinct words, {len(merges)} merges")
        return SubwordTokenizer(
            BPEModel(vocab, merges),
            pre_tokenizer=pre_tokenizer_for(self.pattern),
            decoder=ByteLevelDecoder(),
            added_tokens=special_added_tokens(specials),
            kind=self.kind,
        )


class regex_findall:
    """Picklable ``regex.findall`` for one pattern (worker processes)."""

    def __init__(self, pattern: str):
        self._re = regex.compile(pattern)

    def __call__(self, text: str) -> list[str]:
        return self._re.findall(text)
