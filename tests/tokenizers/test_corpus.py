"""Corpus counting: one regex pass over a joined batch gives exactly the per-text words."""

from collections import Counter

import pytest
import regex
from hypothesis import example, given, settings
from hypothesis import strategies as st

from posttrain.tokenizers import BPETrainer, ByteLevelBPETrainer, UnigramTrainer, WordPieceTrainer
from posttrain.tokenizers import pre_tokenizers as P
from posttrain.tokenizers.corpus import JoinedWords, count_words

# whitespace of every kind the GPT-2 alternatives treat differently, letters, digits, contractions, punctuation
_CHARS = st.sampled_from(
    [" ", " ", "  ", "\t", "\r", "\x85", "\u3000", "a", "Σ", "é", "1", "'", "s", "t", ".", "!", "中"]
)
_LINE = st.lists(_CHARS, max_size=10).map("".join)


def _per_text(fn, texts):
    c = Counter()
    for t in texts:
        c.update(fn(t))
    return c


@settings(max_examples=300, deadline=None)
@given(st.lists(_LINE, max_size=8), st.booleans())
def test_gpt2_lines_pattern_on_joined_lines_equals_gpt2_line_by_line(lines, last_newline):
    texts = [t + "\n" for t in lines]
    if texts and not last_newline:
        texts[-1] = texts[-1][:-1]  # a file's last line may lack its newline
    want = [w for t in texts for w in regex.findall(P.GPT2_PATTERN, t)]
    assert regex.findall(P.GPT2_LINES_PATTERN, "".join(texts)) == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_CHARS | st.just("\n"), max_size=12).map("".join), max_size=8))
@example(["\n\n", ""])  # two newlines in one text, then an empty last text
@example(["a\n", " b\n", "c"])  # a file's last line without its newline: the joined pass applies
def test_byte_level_batch_count_equals_per_text_for_any_texts(texts):
    # texts with inner newlines (JSONL fields) or none at all must fall back to text-by-text splitting
    fn = ByteLevelBPETrainer().words_fn()
    assert isinstance(fn, JoinedWords)
    assert fn.count(texts) == _per_text(P.ByteLevel().split, texts)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(_CHARS | st.just("\n") | st.just("ς") | st.just("İ"), max_size=12).map("".join), max_size=8),
    st.booleans(),
)
def test_whitespace_batch_count_equals_per_text(texts, lowercase):
    norm, pre, _ = BPETrainer(lowercase=lowercase).components()
    one = (lambda t: pre(norm(t))) if norm else pre
    assert BPETrainer(lowercase=lowercase).words_fn().count(texts) == _per_text(one, texts)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(_CHARS | st.sampled_from(["\n", "ς", "İ", "\u0301", "\x00", ",", "中"]), max_size=12).map("".join),
        max_size=8,
    ),
    st.booleans(),
    st.sampled_from([None, True, False]),
)
def test_wordpiece_batch_count_equals_per_text(texts, lowercase, strip_accents):
    fn = WordPieceTrainer(lowercase=lowercase, strip_accents=strip_accents).words_fn()
    assert fn.count(texts) == _per_text(fn.words, texts)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(
            _CHARS
            | st.sampled_from(
                ["\n", "\u2581", "\u0301", "e\u0301", "ﬁ", "Ａ", "\u3000", "\x1c", "\u2028", "¹", "\u1100\u1161", "ｶﾞ"]
            ),
            max_size=12,
        ).map("".join),
        max_size=8,
    ),
    st.booleans(),
    st.booleans(),
)
def test_unigram_batch_count_equals_per_text(texts, nfkc, collapse):
    # NFKC (compatibility forms, compositions across what were line ends), whitespace of every kind, literal
    # '▁' characters, empty texts; texts holding newlines fall back to text-by-text splitting
    fn = UnigramTrainer(nfkc=nfkc, collapse_whitespace=collapse).words_fn()
    assert isinstance(fn, JoinedWords)
    assert fn.count(texts) == _per_text(fn.words, texts)


@pytest.mark.parametrize(
    "trainer", [ByteLevelBPETrainer(), BPETrainer(lowercase=True), WordPieceTrainer(), UnigramTrainer()]
)
def test_count_words_same_for_any_batching_and_workers(trainer, train_texts):
    texts = [t + "\n" for t in train_texts] if trainer.keep_newlines else train_texts
    want = dict(_per_text(trainer.words_fn().words, texts))
    assert count_words(texts, trainer.words_fn(), workers=1) == want
    assert count_words(texts, trainer.words_fn(), workers=2, batch_chars=4096) == want
