"""BPE: the notes' worked example, heap trainer == recount oracle, determinism, merge replay."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.tokenizers import BPETrainer
from posttrain.tokenizers.bpe import BPEModel, encode_words, train_merges, train_merges_slow
from posttrain.tokenizers.merges import count_pairs, merge_ids, merge_string, merge_word


def test_worked_example_low_lower_lowest():
    # counts: (l,o)=3; then (lo,w)=2 ties (w,e)=2 -> lexicographic "lo" < "w"; then (low,e)=2
    alphabet, merges = train_merges({"low": 1, "lower": 1, "lowest": 1}, 3, suffix="</w>")
    assert merges == [("l", "o"), ("lo", "w"), ("low", "e")]
    assert alphabet == ["e", "l", "o", "r</w>", "s", "t</w>", "w", "w</w>"]


def test_merge_ids_docstring_example():
    assert merge_ids([1, 2, 3, 1, 2], 1, 2, 4) == [4, 3, 4]
    assert merge_ids([1, 1, 1], 1, 1, 9) == [9, 1]  # left to right, non-overlapping


def _random_counts(rng: random.Random, n_words: int, alphabet: str) -> dict[str, int]:
    out = {}
    for _ in range(n_words):
        w = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9)))
        out[w] = out.get(w, 0) + rng.randint(1, 20)
    return out


@pytest.fixture(params=["per-word", "vectorised"])
def merge_path(request, monkeypatch):
    """Run a test with every merge applied word by word, then with every merge (a != b) in numpy."""
    import posttrain.tokenizers.merges as merges

    monkeypatch.setattr(merges, "VECTOR_MIN_WORDS", 10**9 if request.param == "per-word" else 1)
    return request.param


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("suffix", [None, "</w>"])
def test_heap_trainer_matches_recount_oracle(seed, suffix, merge_path):
    rng = random.Random(seed)
    wc = _random_counts(rng, 60, "abcde" if seed % 2 else "abcdefghij")  # small alphabets -> many ties
    fast = train_merges(wc, 40, suffix=suffix)
    slow = train_merges_slow(wc, 40, suffix=suffix)
    assert fast == slow


@pytest.mark.parametrize("vector_min", [10**9, 1])
@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(st.text("xyz", min_size=1, max_size=7), st.integers(1, 5), min_size=1, max_size=15),
    st.integers(1, 3),
)
def test_heap_trainer_matches_oracle_property(vector_min, wc, min_freq):
    import posttrain.tokenizers.merges as merges

    merges.VECTOR_MIN_WORDS, old = vector_min, merges.VECTOR_MIN_WORDS
    try:
        assert train_merges(wc, 25, min_frequency=min_freq) == train_merges_slow(wc, 25, min_frequency=min_freq)
    finally:
        merges.VECTOR_MIN_WORDS = old


def test_same_corpus_same_vocabulary(train_texts):
    a = BPETrainer(vocab_size=400, workers=1).train(train_texts)
    b = BPETrainer(vocab_size=400, workers=2).train(list(reversed(train_texts)))
    assert a.model.vocab == b.model.vocab and a.model.merges == b.model.merges
    assert a.vocab_size == 400


def test_encode_replays_merges_by_rank():
    vocab = {c: i for i, c in enumerate(["a", "b", "c", "ab", "bc", "abc"])}
    # rank 0: (b,c) beats (a,b) -> "a"+"bc"; then (a,bc) -> "abc"
    m = BPEModel(vocab, [("b", "c"), ("a", "b"), ("a", "bc")])
    assert m.tokenize("abc") == [vocab["abc"]]
    m2 = BPEModel(vocab, [("a", "b"), ("b", "c")])  # (a,b) first; (ab,c) unknown -> stays split
    assert m2.tokenize("abc") == [vocab["ab"], vocab["c"]]


def test_unknown_characters_unk_or_bytes(train_texts):
    tok = BPETrainer(vocab_size=300, workers=1).train(train_texts)
    ids = tok.encode("x\u16a0y")  # runic letter never seen in training
    assert tok.unk_id in ids
    tokb = BPETrainer(vocab_size=600, workers=1, byte_fallback=True).train(train_texts)
    ids = tokb.encode("\u16a0")
    assert tokb.unk_id not in ids and all(tokb.id_to_token(i).startswith("<0x") for i in ids)
    assert tokb.decode(ids) == "\u16a0"


def test_decode_inverts_whitespace_split(train_texts):
    tok = BPETrainer(vocab_size=500, workers=1).train(train_texts)
    s = "the quick brown fox , jumps"
    assert tok.decode(tok.encode(s)) == s


def test_merge_word_docstring_example():
    x, a, b, c, y = 0, 1, 2, 9, 3
    nw, removed, added = merge_word([x, a, b, a, b, y], a, b, c)
    assert nw == [x, c, c, y]
    assert removed == [(x, a), (a, b), (b, a), (a, b), (b, y)]
    assert added == [(x, c), (c, c), (c, y)]
    assert merge_word([a, a], a, b, c) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=12), st.integers(0, 3), st.integers(0, 3))
def test_merge_word_reports_exact_pair_count_change(w, a, b):
    from collections import Counter

    r = merge_word(w, a, b, 7)
    if r is None:
        assert merge_ids(w, a, b, 7) == w
        return
    nw, removed, added = r
    assert nw == merge_ids(w, a, b, 7)
    before, after = Counter(zip(w, w[1:])), Counter(zip(nw, nw[1:]))
    assert before - Counter(removed) + Counter(added) == after


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=12), st.integers(0, 3), st.integers(0, 3))
def test_merge_string_matches_merge_word(w, a, b):
    s, ab, c = "".join(map(chr, w)), chr(a) + chr(b), chr(7)
    r, r2 = merge_word(w, a, b, 7), merge_string(s, ab, c)
    if r is None:
        assert r2 is None
        return
    nw, removed, added = r
    assert r2 == ("".join(map(chr, nw)), [chr(x) + chr(y) for x, y in removed], [chr(x) + chr(y) for x, y in added])


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text("abcé", max_size=6), st.integers(1, 9), max_size=12), st.sampled_from([None, "</w>"]))
def test_encode_words_and_count_pairs_match_brute_force(wc, suffix):
    from collections import Counter

    words, counts, id_to_str, str_to_id = encode_words(wc, suffix, None)
    kept = [(w, c) for w, c in wc.items() if w]
    assert id_to_str == sorted({s for w, _ in kept for s in _initial(w, suffix)})
    assert [[id_to_str[ord(ch)] for ch in s] for s in words] == [_initial(w, suffix) for w, _ in kept]
    assert counts == [c for _, c in kept]
    pc, where = count_pairs(words, counts)
    want, want_where = Counter(), {}
    for wi, s in enumerate(words):
        for p in zip(s, s[1:]):
            want[p[0] + p[1]] += counts[wi]
            want_where.setdefault(p[0] + p[1], set()).add(wi)
    assert pc == dict(want) and {p: set(v) for p, v in where.items()} == want_where


def _initial(w, suffix):
    syms = list(w)
    if suffix:
        syms[-1] += suffix
    return syms


def test_heap_trainer_matches_oracle_on_repetitive_words(merge_path):
    # long runs of one repeated pair: many merge sites per word, overlapping (a, a) merges, ties
    wc = {"ab" * k + "a" * j: k + j for k in range(1, 7) for j in range(0, 5)}
    wc.update({"a" * k: 2 for k in range(2, 12)})
    for suffix in (None, "</w>"):
        assert train_merges(wc, 30, suffix=suffix) == train_merges_slow(wc, 30, suffix=suffix)
