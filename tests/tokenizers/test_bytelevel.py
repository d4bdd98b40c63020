"""Byte-level BPE: the GPT-2 byte map, regex pre-tokenisers, lossless round trips (text and bytes)."""

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.tokenizers import ByteLevelBPETrainer, symbols
from posttrain.tokenizers import pre_tokenizers as P


def test_bytes_to_unicode_is_a_printable_bijection():
    m = symbols.bytes_to_unicode()
    assert len(m) == 256 and len(set(m.values())) == 256
    assert m[32] == "Ġ" and m[10] == "Ċ" and m[ord("A")] == "A"
    assert all(c.isprintable() and not c.isspace() for c in m.values())


def test_gpt2_pattern_matches_tiktoken_style_split():
    assert P.ByteLevel().split("Hello world's  42x!!") == ["Hello", " world", "'s", " ", " 42", "x", "!!"]
    assert P.ByteLevel()("Hi there") == ["Hi", "Ġthere"]


def test_cl100k_pattern_groups_digits_by_three():
    words = regex.findall(P.CL100K_PATTERN, "abc 1234567 DON'T\n\nx")
    assert words == ["abc", " ", "123", "456", "7", " DON", "'T", "\n\n", "x"]


@pytest.fixture(scope="module", params=["gpt2", "cl100k"])
def tok(request, train_texts):
    return ByteLevelBPETrainer(vocab_size=600, pattern=request.param, workers=1).train(train_texts)


@settings(max_examples=150, deadline=None)
@given(st.text())
def test_roundtrip_arbitrary_unicode(tok, s):
    s = s.encode("utf-8", "surrogatepass").decode("utf-8", "replace")  # a str that is valid UTF-8
    # keep special tokens: a text may spell one ("<bos>"), which encodes to that special id
    assert tok.decode(tok.encode(s), skip_special_tokens=False) == s


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64))
def test_roundtrip_arbitrary_bytes(tok, b):
    assert tok.decode_bytes(tok.encode_bytes(b), skip_special_tokens=False) == b


def test_invalid_utf8_roundtrips_at_bytes_level(tok):
    b = b"ok \xff\xfe broken \xe4\xb8 tail \xf0\x9f\x99\x82"
    ids = tok.encode_bytes(b)
    assert tok.decode_bytes(ids) == b
    assert tok.decode(ids) == b.decode("utf-8", "replace")


def test_every_byte_is_in_the_vocabulary(tok):
    for b in range(256):
        assert tok.token_to_id(symbols.BYTE_TO_UNICODE[b]) is not None


def test_special_tokens_are_never_split(tok):
    ids = tok.encode("a<eos>b<pad>")
    assert tok.eos_id in ids and tok.pad_id in ids
    assert tok.decode(ids) == "ab" and tok.decode(ids, skip_special_tokens=False) == "a<eos>b<pad>"


def test_encode_batch_matches_encode(tok, heldout_texts):
    texts = heldout_texts[:200]
    assert tok.encode_batch(texts, workers=2) == [tok.encode(t) for t in texts]
