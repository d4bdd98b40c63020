"""BPE on one long unbroken line (one giant "word"): same merges as the recount oracle, each merge visits each
word once (it used to search a word once per occurrence of the pair: quadratic), progress on stderr."""

import random
from collections import defaultdict

import pytest

import posttrain.tokenizers.merges as merges
from posttrain.tokenizers import BPETrainer, ByteLevelBPETrainer
from posttrain.tokenizers.bpe import initial_alphabet, initial_symbols, train_merges, train_merges_slow


def _long_word(n: int, seed: int) -> str:
    """Letters with runs (``aaaa``: the a == b merge path) and repeats (many occurrences per merge)."""
    rng = random.Random(seed)
    parts = []
    while sum(map(len, parts)) < n:
        parts.append(
            rng.choice(["the", "post", "train", "aaaa", "bb", "ab", rng.choice("abcdefg") * rng.randint(1, 5)])
        )
    return "".join(parts)[:n]


@pytest.mark.parametrize("vector_min", [10**9, 1], ids=["per-word", "vectorised"])
@pytest.mark.parametrize("suffix", [None, "</w>"])
@pytest.mark.parametrize("seed", [0, 1])
def test_long_word_matches_recount_oracle(monkeypatch, vector_min, suffix, seed):
    monkeypatch.setattr(merges, "VECTOR_MIN_WORDS", vector_min)
    wc = {_long_word(3000, seed): 1, _long_word(500, seed + 7): 3, "the": 5, "aaaa": 2}
    assert train_merges(wc, 60, suffix=suffix) == train_merges_slow(wc, 60, suffix=suffix)


class _CountingWords(list):
    def __init__(self, *a):
        super().__init__(*a)
        self.reads = 0

    def __getitem__(self, i):
        self.reads += 1
        return super().__getitem__(i)


def test_merge_visits_each_word_once_however_often_it_holds_the_pair():
    """`where` lists a word once per occurrence of a pair; merging "aa" in one word of 2000 a's (1000
    occurrences) must read that word once, not 1000 times (999 full scans of a word that lost the pair)."""
    words = _CountingWords(["\x00" * 2000, "\x01\x00\x00"])
    touched = [0] * 1000 + [1]
    delta = merges.merge_few(words, [1, 4], touched, "\x00\x00", "\x02", defaultdict(merges.new_index))
    assert words.reads == 2
    assert list.__getitem__(words, 0) == "\x02" * 1000 and list.__getitem__(words, 1) == "\x01\x02"
    assert delta == {"\x02\x02": 999, "\x01\x00": -4, "\x01\x02": 4}


@pytest.mark.parametrize("suffix", [None, "</w>"])
def test_initial_alphabet_is_initial_symbols(suffix):
    wc = {"low": 1, "lower": 2, "x": 1, "": 4, _long_word(200, 3): 1}
    want = sorted({s for w in wc for s in initial_symbols(w, suffix)})
    assert initial_alphabet(wc, suffix) == want


@pytest.mark.parametrize(
    "trainer, desc",
    [
        (BPETrainer(vocab_size=120), "bpe"),  # desc: the log line
        (ByteLevelBPETrainer(vocab_size=320), "byte-bpe"),
    ],
)
def test_merges_report_progress_every_ten_percent(capsys, trainer, desc):
    logged = []
    trainer.train([_long_word(20000, 5)], log=logged.append)
    err = capsys.readouterr().err.splitlines()
    lines = [ln for ln in err if ln.startswith("bpe: merges: ")]  # both are BPE merges
    assert len(lines) == 10, err
    done, total = lines[-1].split(" ")[2].split("/")
    assert done == total and "(100%)" in lines[-1]
    assert logged and logged[-1].startswith(f"{desc}: 1 distinct words")


def test_no_log_no_output(capsys):
    BPETrainer(vocab_size=80).train([_long_word(2000, 6)])
    assert capsys.readouterr().err == ""
