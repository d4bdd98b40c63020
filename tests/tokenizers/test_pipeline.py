"""SubwordTokenizer.encode_batch: the in-process path and the forked big-chunk path both equal
``[encode(t) for t in texts]``, order kept, for Unigram (with unknowns and specials) and byte-level BPE."""

import pytest

from posttrain.tokenizers import TRAINERS, pipeline


@pytest.fixture(scope="module")
def toks(train_texts):
    return {
        kind: TRAINERS[kind](workers=1, **kw).train(train_texts[:800])
        for kind, kw in (("unigram", dict(vocab_size=400)), ("byte-bpe", dict(vocab_size=400)))
    }


@pytest.mark.parametrize("kind", ["unigram", "byte-bpe"])
@pytest.mark.parametrize("fork_min_chars", [1, 1 << 40])
def test_encode_batch_equals_encode(kind, fork_min_chars, toks, heldout_texts, monkeypatch):
    monkeypatch.setattr(pipeline, "FORK_MIN_CHARS", fork_min_chars)  # 1: always fork; huge: never
    tok = toks[kind]
    texts = heldout_texts + ["<bos>x<eos>", "Ωμέγα ☃ 🙂"] + [""] * 3
    want = [tok.encode(t) for t in texts]
    tok._cache.clear()  # workers start cold, like a fresh tokenizer
    assert tok.encode_batch(texts, workers=2) == want
    assert tok.encode_batch(texts[:1], workers=3) == want[:1]
    assert tok.encode_batch([], workers=2) == []
