"""The Digits pre-tokenizer and the pipeline's byte-level BPE, checked against Hugging Face ``tokenizers``."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from posttrain.pipeline.data_stages import tokenizer_stats, train_tokenizer
from posttrain.tokenizers import load
from posttrain.tokenizers.pre_tokenizers import Digits

hf = pytest.importorskip("tokenizers")

TEXTS = [
    "The farmers walked 12 miles in 1999, and 3 more later!",
    "Q: 37+48= A: 85",
    "Q: 9+0= A: 9",
    "Every painter repainted the bridge near the harbor in 2024.",
    "unhelpful helpers helped",
    "numbers ²٣ ok",
] * 20


@given(st.text(alphabet="ab 1234567890+=²٣\n", max_size=30), st.booleans())
def test_digits_matches_hf(text, individual):
    want = [w for w, _ in hf.pre_tokenizers.Digits(individual_digits=individual).pre_tokenize_str(text)]
    assert Digits(individual)(text) == want


def test_pipeline_tokenizer_encodes_as_hf_and_spells_numbers_digit_by_digit(tmp_path):
    tok = train_tokenizer(TEXTS, vocab_size=300, min_frequency=2, individual_digits=True)
    tok.save(tmp_path / "tokenizer.json")
    ours = load(tmp_path / "tokenizer.json")
    theirs = hf.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in TEXTS[:6] + ["1234567890", " 42 apples", "x=100-7"]:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False).ids == tok.encode(text)
        assert ours.decode(ours.encode(text)) == text
    assert ours.tokenize("1999") == ["1", "9", "9", "9"]
    s = tokenizer_stats(ours, TEXTS)
    assert s["digits_single_tokens"] is True and s["vocab_size"] == 300
    assert s["bytes_per_token"] == pytest.approx(sum(len(t.encode()) for t in TEXTS) / s["tokens"])
    assert sum(s["tokens_per_word_histogram"].values()) == sum(len(t.split()) for t in TEXTS)
