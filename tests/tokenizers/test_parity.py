"""Parity with Hugging Face `tokenizers`, both directions, for every model type.

Export: train with posttrain, save tokenizer.json, load it in `tokenizers`: same ids (and decoded text)
on held-out texts. Import: train with `tokenizers`, save, load with posttrain: same ids and text.
"""

import pytest

from posttrain.tokenizers import TRAINERS, Tokenizer, load

tokenizers = pytest.importorskip("tokenizers")

SETTINGS = {
    "bpe": dict(vocab_size=500),
    "byte-bpe": dict(vocab_size=600),
    "wordpiece": dict(vocab_size=600),
    "unigram": dict(vocab_size=600, byte_fallback=True),
}
EXTRA = {
    "byte-bpe-cl100k": ("byte-bpe", dict(vocab_size=600, pattern="cl100k")),
    "unigram-unk": ("unigram", dict(vocab_size=600)),
}


def _assert_same(ours, ref, texts):
    for t in texts:
        want = ref.encode(t, add_special_tokens=False).ids
        assert ours.encode(t) == want, t
        assert ours.decode(want) == ref.decode(want), t


@pytest.mark.parametrize("name", list(SETTINGS) + list(EXTRA))
def test_export_loads_in_tokenizers_with_same_ids(name, train_texts, heldout_texts, tmp_path):
    kind, kw = EXTRA.get(name, (name, SETTINGS.get(name)))
    tok = TRAINERS[kind](workers=1, **kw).train(train_texts)
    assert isinstance(tok, Tokenizer)
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    ref = tokenizers.Tokenizer.from_file(str(path))
    assert ref.get_vocab_size() == tok.vocab_size
    _assert_same(tok, ref, heldout_texts + ["<bos>hello<eos>", "[CLS] x [SEP]"])
    again = load(path)
    assert again.kind == kind and again.encode(heldout_texts[3]) == tok.encode(heldout_texts[3])


def _hf_train(kind, texts):
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    if kind == "bpe":
        t = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix="</w>"))
        t.pre_tokenizer = pre_tokenizers.Whitespace()
        t.decoder = decoders.BPEDecoder()
        tr = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<pad>"], end_of_word_suffix="</w>")
    elif kind == "byte-bpe":
        t = tokenizers.Tokenizer(models.BPE())
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        t.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(
            vocab_size=600, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
    elif kind == "wordpiece":
        t = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
        t.normalizer = normalizers.BertNormalizer(lowercase=False)
        t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        t.decoder = decoders.WordPiece()
        tr = trainers.WordPieceTrainer(vocab_size=600, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    else:
        t = tokenizers.Tokenizer(models.Unigram())
        t.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(tokenizers.Regex(r" {2,}"), " ")])
        t.pre_tokenizer = pre_tokenizers.Metaspace()
        t.decoder = decoders.Metaspace()
        tr = trainers.UnigramTrainer(vocab_size=600, special_tokens=["<unk>", "<pad>"], unk_token="<unk>")
    t.train_from_iterator(texts, tr)
    return t


@pytest.mark.parametrize("kind", list(SETTINGS))
def test_import_of_tokenizers_files_encodes_identically(kind, train_texts, heldout_texts, tmp_path):
    ref = _hf_train(kind, train_texts)
    path = tmp_path / "tokenizer.json"
    ref.save(str(path))
    ours = load(path)
    assert ours.kind == kind and ours.vocab_size == ref.get_vocab_size()
    _assert_same(ours, ref, heldout_texts)
