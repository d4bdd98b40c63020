"""Unigram training (Kudo 2018, SentencePiece's default): prune a big seed vocabulary by EM.

Key insight: fit ``p`` by EM (E-step: forward-backward over each word's lattice gives expected piece
counts; M-step: ``log p_i = digamma(c_i) - digamma(sum_j c_j)``, SentencePiece's sparse-prior update),
then delete the pieces whose removal lowers the corpus likelihood least,
``loss_i = F_i * (log p_i - sum_{a in alt(i)} log p'_a)`` where ``alt(i)`` is the best segmentation of
piece ``i`` without itself; repeat until the vocabulary fits. Single characters are never pruned, so
every kept character can always be spelt. Seeds: :mod:`seeds`; lattices and sweeps: :mod:`lattice`.

Words are SentencePiece-style: ``' '`` -> ``'▁'`` and each word starts with ``'▁'`` (Metaspace).
Not handled: training from an existing vocabulary; sentencepiece's ``split_digits``.
"""

from __future__ import annotations

import os
import unicodedata
from collections import Counter
from dataclasses import dataclass

import numpy as np
import regex

from posttrain.errors import UserError
from posttrain.tokenizers.corpus import JoinedWords, count_words
from posttrain.tokenizers.decoders import (
    ByteFallbackDecoder,
    DecoderSequence,
    FuseDecoder,
    MetaspaceDecoder,
    ReplaceDecoder,
    StripDecoder,
)
from posttrain.tokenizers.normalizers import NormalizerSequence, Replace, UnicodeNormalizer
from posttrain.tokenizers.pipeline import SubwordTokenizer, TextToWords, special_added_tokens
from posttrain.tokenizers.pre_tokenizers import Metaspace
from posttrain.tokenizers.symbols import BYTE_TOKENS, METASPACE
from posttrain.tokenizers.unigram.lattice import Lattice, release_memory
from posttrain.tokenizers.unigram.model import UnigramModel
from posttrain.tokenizers.unigram.seeds import (
    HashIndex,
    count_substrings,
    kept_characters,
    script_breaks,
    split_uncovered,
)


def digamma(x: np.ndarray) -> np.ndarray:
    """psi(x) for x > 0: recurrence psi(x) = psi(x+1) - 1/x up to x >= 10, then the asymptotic series
    (truncation error < 1e-12)."""
    x = np.asarray(x, dtype=np.float64).copy()
    acc = np.zeros_like(x)
    for _ in range(10):
        small = x < 10
        if not small.any():
            break
        acc[small] -= 1.0 / x[small]
        x[small] += 1.0
    inv = 1.0 / x
    inv2 = inv * inv
    return (
        acc
        + np.log(x)
        - 0.5 * inv
        - inv2 * (1.0 / 12 - inv2 * (1.0 / 120 - inv2 * (1.0 / 252 - inv2 * (1.0 / 240 - inv2 / 132))))
    )


def train_unigram(
    word_counts: dict[str, int],
    vocab_size: int,
    *,
    n_reserved: int = 0,
    character_coverage: float = 0.9995,
    seed_size: int | None = None,
    max_piece_length: int = 16,
    shrinking_factor: float = 0.75,
    n_sub_iterations: int = 2,
    max_word_length: int = 32,
    split_by_script: bool = True,
    threads: int = 2,
    log=None,
) -> list[tuple[str, float]]:
    """Learn ``vocab_size - n_reserved`` pieces with log-probabilities, sorted by score (best first).

    ``word_counts`` holds Metaspace words ("▁hello"). ``n_reserved`` counts the special and byte
    pieces the caller adds. ``seed_size`` defaults to max(10 * target, 50k), capped at 1M: the seeds
    are every character plus the substrings (count >= 2) with the largest count * length, ties broken
    by the substring's hash (deterministic). With ``split_by_script`` (sentencepiece's default) a piece
    holds characters of one Unicode script (digits and punctuation are "Common"; kana count as Han).
    ``threads`` (1 or 2) is how many threads seeding, the
    lattice build and the E-step use; the result is the same for either.
    """
    if not word_counts:
        raise UserError("cannot train a Unigram tokenizer on an empty corpus")
    target = vocab_size - n_reserved
    words, counts, n_chars = _covered_words(word_counts, vocab_size, n_reserved, character_coverage, max_word_length)
    seed_size = seed_size or min(1_000_000, max(10 * target, 50_000))
    logp, is_char, seed_len, lookup = _seeds(
        words, counts, n_chars, seed_size, max_piece_length, split_by_script, threads
    )
    corpus = Lattice(words, max_piece_length, lookup, counts, threads=threads)
    strs = _piece_strings(corpus, words, seed_len)
    prune = _Pruner(strs, max_piece_length, lookup, threads)
    del lookup  # the pruner drops it once the pieces' own lattices are built
    alive = np.ones(is_char.size, dtype=bool)
    desired = int(target * 1.1)
    round_ = 0
    while True:
        logp, alive, ll = _em(corpus, logp, alive, is_char, n_sub_iterations)
        n_alive = int(alive.sum())
        if log:
            log(f"unigram round {round_}: {n_alive} pieces, log-likelihood {ll:.6g}")
        round_ += 1
        if n_alive <= desired:
            break
        logp, alive = prune(corpus, logp, alive, is_char, max(desired, int(shrinking_factor * n_alive)))
    return _finalise(strs, logp, alive, is_char, target - int(is_char.sum()))


def _covered_words(word_counts: dict[str, int], vocab_size: int, n_reserved: int, coverage: float, max_len: int):
    """The distinct words cut at uncovered characters and into <= max_len chunks, sorted; their counts; and
    the number of characters (an error if the vocabulary cannot hold them)."""
    kept = kept_characters(word_counts, coverage)
    wc = split_uncovered(word_counts, kept, max_len)
    words = sorted(wc)
    counts = np.array([wc[w] for w in words], dtype=np.float64)
    chars = sorted({ch for w in words for ch in w})
    if vocab_size - n_reserved < len(chars):
        raise UserError(
            f"unigram: --vocab-size {vocab_size} is below the alphabet size ({len(chars)} characters at "
            f"character coverage {coverage} + {n_reserved} reserved pieces); raise the vocab "
            f"size or lower the character coverage"
        )
    return words, counts, len(chars)


def _seeds(
    words: list[str],
    counts: np.ndarray,
    n_chars: int,
    seed_size: int,
    max_len: int,
    split_by_script: bool,
    threads: int,
):
    """All characters + the frequent substrings, scored count * length: (initial logp, is_char, length, lookup)."""
    n_multi = max(0, seed_size - n_chars)
    uh1, uh2, ufreq, ulen = count_substrings(
        words,
        counts,
        max_len,
        keep_top=n_multi,
        threads=threads,
        breaks=script_breaks(words) if split_by_script else None,
    )
    ufreq = ufreq.astype(np.float64)
    char_u = np.flatnonzero(ulen == 1)
    char_u = char_u[np.argsort(uh1[char_u])]  # a character's hash is its code point + 1: by h1 = by character
    multi_u = np.flatnonzero(ulen > 1)
    multi_u = multi_u[np.lexsort((uh1[multi_u], -(ufreq[multi_u] * ulen[multi_u])))][:n_multi]
    seed_u = np.concatenate([char_u, multi_u])
    is_char = np.zeros(seed_u.size, dtype=bool)
    is_char[: char_u.size] = True
    seed_len = ulen[seed_u].astype(np.int64)
    freq0 = ufreq[seed_u] * np.where(is_char, 1, seed_len)
    logp = np.log(freq0) - np.log(freq0.sum())
    lookup = HashIndex(uh1[seed_u], uh2[seed_u])
    del uh1, uh2, ufreq, ulen
    release_memory()
    return logp, is_char, seed_len, lookup


def _piece_strings(corpus: Lattice, words: list[str], seed_len: np.ndarray) -> list[str]:
    """Each seed's string, read off one of its occurrences in the corpus lattice."""
    where = np.zeros(seed_len.size, dtype=np.int64)
    where[corpus.ep] = np.arange(corpus.ep.size)  # some occurrence of every seed: its string
    sid, end = corpus.string_and_end(where)
    strs = [words[k][e - n : e] for k, e, n in zip(sid.tolist(), end.tolist(), seed_len.tolist())]
    del where, sid, end
    release_memory()
    return strs


def _em(corpus: Lattice, logp: np.ndarray, alive: np.ndarray, is_char: np.ndarray, n_sub_iterations: int):
    """EM sub-iterations: expected counts (E), pieces expected under 0.5 times die, digamma update (M).
    Returns (logp, alive, log-likelihood of the last E-step)."""
    P = is_char.size
    for _ in range(n_sub_iterations):
        expected, ll = corpus.expected_counts(logp, P)
        drop = alive & ~is_char & (expected < 0.5)
        if drop.any():
            alive &= ~drop
            corpus.drop_dead(alive, 0.2)
        freq = np.where(alive, np.maximum(expected, np.where(is_char, 1.0, 0.0)), 0.0)
        lp = np.full(P, -np.inf)
        lp[alive] = digamma(freq[alive]) - digamma(np.array([freq[alive].sum()]))[0]
        logp = lp
    return logp, alive, ll


class _Pruner:
    """One pruning step: Viterbi frequencies and each piece's loss if removed, keep the best ``new_size``.

    The pieces' own lattices (without the full-span edge, so: their alternative segmentations) are built at
    the first prune, for the pieces EM left alive (a fraction of the seeds); the seeds' hash index is then
    released."""

    def __init__(self, strs: list[str], max_len: int, lookup, threads: int):
        self.strs, self.max_len, self.lookup, self.threads = strs, max_len, lookup, threads
        self.alt_lat = self.multi_ids = None

    def __call__(self, corpus: Lattice, logp, alive, is_char, new_size: int):
        P = is_char.size
        wid, pid = corpus.viterbi_paths(logp)
        vfreq = np.bincount(pid, weights=corpus.counts[wid], minlength=P)
        # F_i: occurrences on Viterbi paths / number of words, as sentencepiece (its inverted index holds
        # one entry per occurrence, so a piece used twice in a word counts twice)
        F = vfreq / corpus.counts.sum()
        total = vfreq.sum()
        self._alternatives(alive, is_char)
        awid, apid = self.alt_lat.viterbi_paths(logp, alive[self.multi_ids])
        owner = self.multi_ids[awid]
        n_alt = np.bincount(owner, minlength=P).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            logsum_alt = np.log(total + vfreq * (n_alt - 1))
            lp_alt = np.bincount(owner, weights=np.log(vfreq[apid] + vfreq[owner]), minlength=P) - n_alt * logsum_alt
            lp_sp = np.log(vfreq) - np.log(total)
            loss = F * (lp_sp - lp_alt)
        removable = np.flatnonzero(alive & ~is_char & (vfreq > 0))
        n_keep = max(0, new_size - int((alive & is_char).sum()))
        ranked = removable[np.lexsort((removable, -loss[removable]))]
        keep = is_char & alive
        keep[ranked[:n_keep]] = True
        logp = np.where(keep, logp, -np.inf)
        corpus.drop_dead(keep, 0.2)
        return logp, keep

    def _alternatives(self, alive, is_char) -> None:
        if self.alt_lat is not None:
            self.alt_lat.drop_dead(alive, 0.2)
            return
        self.multi_ids = np.flatnonzero(alive & ~is_char)
        multi = [self.strs[i] for i in self.multi_ids.tolist()]
        self.alt_lat = Lattice(
            multi,
            self.max_len,
            self.lookup,
            np.ones(len(multi)),
            exclude_full=True,
            alive=alive,
            backward=False,
            threads=self.threads,
        )  # only Viterbi runs on it
        self.lookup = None
        del multi
        release_memory()


def _finalise(strs: list[str], logp, alive, is_char, n_multi: int) -> list[tuple[str, float]]:
    """The characters plus the ``n_multi`` best-scoring other pieces, sorted by score (ties by seed order)."""
    ids = np.flatnonzero(alive & ~is_char)
    ids = ids[np.lexsort((ids, -logp[ids]))][: max(0, n_multi)]
    final = np.concatenate([np.flatnonzero(is_char & alive), ids])
    final = final[np.lexsort((final, -logp[final]))]
    return [(strs[i], float(logp[i])) for i in final.tolist()]


class _JoinedMetaspace:
    """Counter of the Metaspace words of newline-joined texts (none holding a newline), equal to splitting
    text by text: NFKC never moves, merges or creates a newline (a starter that composes with nothing),
    whitespace runs are collapsed within lines (``[^\\S\\n]+``), then every non-empty line is made to start
    with '▁' so that removing the newlines leaves the word boundaries exactly where they were; one
    ``split('▁')`` and one ``Counter`` then count the whole batch. ``fallback`` (the per-text splitter)
    handles a batch whose newlines the normaliser changed."""

    _WS = regex.compile(r"[^\S\n]+")
    _LINE_START = regex.compile("\n(?=[^\n\u2581])")

    def __init__(self, nfkc: bool, collapse_whitespace: bool, fallback):
        self.nfkc, self.collapse, self.fallback = nfkc, collapse_whitespace, fallback

    def __call__(self, text: str) -> Counter:
        raw = text
        if self.nfkc:
            text = unicodedata.normalize("NFKC", text)
        if text.count("\n") != raw.count("\n"):  # cannot happen with NFKC; kept as a guard
            c: Counter = Counter()
            for t in raw.split("\n"):
                c.update(self.fallback(t))
            return c
        if self.collapse:
            text = self._WS.sub(" ", text)
        text = self._LINE_START.sub("\n" + METASPACE, "\n" + text.replace(" ", METASPACE)).replace("\n", "")
        parts = Counter(text.split(METASPACE))
        parts[""] -= 1  # the text starts with '▁' (or is empty): the empty part before it is not a word
        return Counter({METASPACE + p: c for p, c in parts.items() if c > 0})


@dataclass
class UnigramTrainer:
    """SentencePiece-style Unigram: NFKC + whitespace collapse (optional), Metaspace words, EM + pruning,
    character coverage, optional byte fallback (256 ``<0xNN>`` pieces)."""

    vocab_size: int = 8000
    special_tokens: tuple[str, ...] = ("<unk>", "<pad>", "<bos>", "<eos>")
    unk_token: str = "<unk>"
    character_coverage: float = 0.9995
    byte_fallback: bool = False
    nfkc: bool = True
    collapse_whitespace: bool = True
    seed_size: int | None = None
    max_piece_length: int = 16
    shrinking_factor: float = 0.75
    n_sub_iterations: int = 2
    split_by_script: bool = True
    workers: int | None = None

    kind = "unigram"
    keep_bytes = False
    keep_newlines = False

    def components(self):
        steps = ([UnicodeNormalizer("NFKC")] if self.nfkc else []) + (
            [Replace(r"\s+", " ", True)] if self.collapse_whitespace else []
        )
        norm = None if not steps else steps[0] if len(steps) == 1 else NormalizerSequence(steps)
        pre = Metaspace(METASPACE, "always", True)
        if self.byte_fallback:
            dec = DecoderSequence(
                [ReplaceDecoder(METASPACE, " "), ByteFallbackDecoder(), FuseDecoder(), StripDecoder(" ", 1, 0)]
            )
        else:
            dec = MetaspaceDecoder(METASPACE, "always", True)
        return norm, pre, dec

    def words_fn(self):
        """Per text: NFKC, whitespace runs -> ' ', Metaspace words. A batch of texts without newlines is
        counted in one pass over the texts joined by newlines (:class:`_JoinedMetaspace`)."""
        norm, pre, _ = self.components()
        return JoinedWords(
            TextToWords(norm, pre),
            _JoinedMetaspace(self.nfkc, self.collapse_whitespace, TextToWords(norm, pre)),
            sep="\n",
            sep_free=True,
        )

    def train(self, texts, log=None):
        return self.train_from_counts(count_words(texts, self.words_fn(), workers=self.workers), log=log)

    def train_from_counts(self, word_counts: dict[str, int], log=None):
        if not (0 < self.character_coverage <= 1):
            raise UserError(f"character_coverage must be in (0, 1], got {self.character_coverage}")
        specials = list(self.special_tokens)
        if self.unk_token not in specials:
            specials.insert(0, self.unk_token)
        reserved = specials + (BYTE_TOKENS if self.byte_fallback else [])
        learned = train_unigram(
            word_counts,
            self.vocab_size,
            n_reserved=len(reserved),
            character_coverage=self.character_coverage,
            seed_size=self.seed_size,
            max_piece_length=self.max_piece_length,
            shrinking_factor=self.shrinking_factor,
            n_sub_iterations=self.n_sub_iterations,
            split_by_script=self.split_by_script,
            threads=min(2, self.workers or os.cpu_count() or 1),
            log=log,
        )
        taken = set(reserved)
        # 12 significant digits: a JSON float that short parses exactly in every reader (serde_json's
        # default float parser is only "best effort" on 17-digit reprs, which flips Viterbi near-ties).
        pieces = [(t, 0.0) for t in reserved] + [(p, float(f"{s:.12g}")) for p, s in learned if p not in taken]
        model = UnigramModel(pieces, unk_id=specials.index(self.unk_token), byte_fallback=self.byte_fallback)
        norm, pre, dec = self.components()
        return SubwordTokenizer(
            model,
            normalizer=norm,
            pre_tokenizer=pre,
            decoder=dec,
            added_tokens=special_added_tokens(specials),
            kind=self.kind,
        )
