"""Unigram language-model tokenizer (Kudo 2018, SentencePiece's default): prune a big vocabulary by EM.

Key insight: a word's probability is a sum over its segmentations, ``P(x) = sum_{s in S(x)} prod_i p(s_i)``.
Training starts from many frequent substrings, fits ``p`` by EM (E-step: forward-backward over each
word's lattice gives expected piece counts; M-step: ``log p_i = digamma(c_i) - digamma(sum_j c_j)``,
SentencePiece's sparse-prior update) and then deletes the pieces whose removal lowers the corpus
likelihood least, ``loss_i = F_i * (log p_i - sum_{a in alt(i)} log p'_a)`` where ``alt(i)`` is the
best segmentation of piece ``i`` without itself; repeat until the vocabulary fits. Single characters
are never pruned, so every kept character can always be spelt.

Encoding is Viterbi: ``best[e] = max_{b<e, x[b:e] in V} best[b] + log p(x[b:e])`` (ties: longest last
piece, as in ``tokenizers``), computed by forward pushes over a prefix table (a trie flattened into
one dict); a character not in the vocabulary becomes ``<unk>`` with score ``min_score - 10``
(consecutive ones fused) or, with ``byte_fallback``, its UTF-8 ``<0xNN>`` pieces.
Subword regularisation: ``sample`` draws a segmentation with probability ``∝ P(s)^alpha`` by
forward-filtering backward-sampling.

Words are SentencePiece-style: ``' '`` -> ``'▁'`` and each word starts with ``'▁'`` (Metaspace).
``character_coverage`` keeps the most frequent characters covering that fraction of the corpus
(0.9995 by default, as sentencepiece); rarer characters are left to byte fallback or ``<unk>``,
which is what makes an 8k vocabulary possible on English + Chinese text.

The trainer is vectorised with numpy over a flat lattice of all distinct words (one position per
(word, offset), laid out offset-major; edges = (begin, end, piece), int32, compacted as pieces die):
forward, backward and Viterbi loop only over the offset inside a word. Seeds come from counting all
substrings by two 64-bit hashes in hash buckets with a running top-k; the lattice's edges are looked
up in an open-addressing table of the seeds' hashes and come out already in sweep order (no sort).
Seeding, the lattice build and the E-step run on two threads (numpy releases the GIL), with results
that do not depend on the thread count. Oracles in the tests: brute-force enumeration of
segmentations for the flat lattice (expected counts, likelihood, Viterbi paths) and for the encoder,
whose lattice-building twin ``viterbi_slow`` also checks its tie rule; a Counter of all substrings
for the seed counts.

Pieces hold one Unicode script (sentencepiece's ``split_by_unicode_script``, on by default; digits and
punctuation are Common). Not handled: sentencepiece's ``split_digits`` and whitespace-only pieces,
n-best encoding.
"""

from __future__ import annotations

import math
import os
import re
import threading
import unicodedata
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import regex

from posttrain.errors import UserError

UNK_PENALTY = 10.0
BYTE_PIECES = [f"<0x{b:02X}>" for b in range(256)]
META = "\u2581"


def release_memory() -> None:
    """Hand freed heap pages back to the OS. glibc keeps the pages of many mid-sized freed numpy arrays
    (its mmap threshold grows after large frees), so without this the seeding phase's peak would stay
    resident through training. No-op where glibc is absent."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


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
    return acc + np.log(x) - 0.5 * inv - inv2 * (1.0 / 12 - inv2 * (1.0 / 120 - inv2 * (1.0 / 252 - inv2 * (1.0 / 240 - inv2 / 132))))


# ------------------------------------------------------------------------------------------------
# Model (encoding)
# ------------------------------------------------------------------------------------------------
class UnigramModel:
    """``pieces`` = [(piece, log_prob)] in id order; ``unk_id`` indexes the unknown piece."""

    type = "Unigram"

    def __init__(self, pieces: list[tuple[str, float]], unk_id: int | None = 0, byte_fallback: bool = False):
        self.pieces = [(p, float(s)) for p, s in pieces]
        self.vocab = {}
        for i, (p, _) in enumerate(self.pieces):
            self.vocab.setdefault(p, i)
        self.scores = [s for _, s in self.pieces]
        self.unk_id, self.byte_fallback = unk_id, byte_fallback
        if unk_id is not None and not (0 <= unk_id < len(self.pieces)):
            raise UserError(f"Unigram unk_id {unk_id} is outside the vocabulary of {len(self.pieces)} pieces")
        if unk_id is None and not byte_fallback:
            pass  # unknown characters raise at encode time
        self.min_score = min(self.scores) if self.scores else 0.0
        self.unk_score = self.min_score - UNK_PENALTY
        self.max_len = max((len(p) for p, _ in self.pieces), default=1)
        # prefix table (a trie flattened into one dict): every prefix of every piece -> (id, score) of the
        # piece spelt by that prefix, or (-1, 0.0) if it is only a prefix. Viterbi extends a match only
        # while the substring is still a prefix, so it does ~(match depth + 1) lookups per position
        # instead of max_len.
        table: dict[str, tuple[int, float]] = {}
        for p in self.vocab:
            for k in range(1, len(p)):
                table.setdefault(p[:k], (-1, 0.0))
        for p, i in self.vocab.items():
            table[p] = (i, self.scores[i])
        self._table = table

    def _lattice(self, word: str):
        """For each end position e: list of (begin, piece_id or -1 for unk, score), begins ascending."""
        n, vocab, scores, L = len(word), self.vocab, self.scores, self.max_len
        ends: list[list[tuple[int, int, float]]] = [[] for _ in range(n + 1)]
        for b in range(n):
            has_single = False
            for e in range(b + 1, min(n, b + L) + 1):
                i = vocab.get(word[b:e])
                if i is not None:
                    ends[e].append((b, i, scores[i]))
                    if e == b + 1:
                        has_single = True
            if not has_single:
                ends[b + 1].append((b, -1, self.unk_score))
        for lst in ends:
            lst.sort(key=lambda t: t[0])
        return ends

    def _best_path(self, word: str) -> tuple[list[int], list[int]]:
        """Viterbi by forward pushes over the prefix table: (back_begin, back_id) per end position, id -1
        for an unknown character. Begins are visited in ascending order and a tie never replaces, so among
        equal scores the smallest begin (longest last piece) wins, as in :meth:`viterbi_slow`."""
        n, table, unk = len(word), self._table, self.unk_score
        best = [0.0] + [-math.inf] * n
        back_b = [0] * (n + 1)
        back_i = [-1] * (n + 1)
        for b in range(n):
            base = best[b]
            e = b + 1
            t = table.get(word[b])
            if t is None or t[0] < 0:  # no single-character piece: the unknown edge (b, b+1)
                v = base + unk
                if v > best[e]:
                    best[e], back_b[e], back_i[e] = v, b, -1
            while t is not None:
                i = t[0]
                if i >= 0:
                    v = base + t[1]
                    if v > best[e]:
                        best[e], back_b[e], back_i[e] = v, b, i
                e += 1
                if e > n:
                    break
                t = table.get(word[b:e])
        return back_b, back_i

    def viterbi(self, word: str) -> list[tuple[str, int]]:
        """Best segmentation as (piece string, id or -1 for unknown)."""
        if not word:
            return []
        return self._segments(word, *self._best_path(word))

    @staticmethod
    def _segments(word: str, back_b: list[int], back_i: list[int]) -> list[tuple[str, int]]:
        """Follow the back-pointers from the end: (piece string, id or -1) left to right."""
        out = []
        e = len(word)
        while e > 0:
            b = back_b[e]
            out.append((word[b:e], back_i[e]))
            e = b
        out.reverse()
        return out

    def viterbi_slow(self, word: str) -> list[tuple[str, int]]:
        """The oracle of :meth:`viterbi`: build the whole lattice (ends -> edges), then relax end by end."""
        n = len(word)
        if n == 0:
            return []
        ends = self._lattice(word)
        best = [0.0] + [-math.inf] * n
        back: list[tuple[int, int]] = [(0, 0)] * (n + 1)
        for e in range(1, n + 1):
            bs, bb = -math.inf, None
            for b, i, s in ends[e]:
                v = best[b] + s
                if v > bs:
                    bs, bb = v, (b, i)
            best[e], back[e] = bs, bb  # type: ignore[assignment]
        out = []
        e = n
        while e > 0:
            b, i = back[e]
            out.append((word[b:e], i))
            e = b
        out.reverse()
        return out

    def _to_ids(self, segs: list[tuple[str, int]]) -> list[int]:
        ids: list[int] = []
        pending = []  # fused run of unknown characters
        for s, i in segs + [("", 0)]:
            if i == -1:
                pending.append(s)
                continue
            if pending:
                u = "".join(pending)
                pending = []
                if self.byte_fallback and all(bp in self.vocab for bp in (f"<0x{x:02X}>" for x in u.encode("utf-8", "surrogatepass"))):
                    ids.extend(self.vocab[f"<0x{x:02X}>"] for x in u.encode("utf-8", "surrogatepass"))
                elif self.unk_id is not None:
                    ids.append(self.unk_id)
                else:
                    raise UserError(f"character {u[0]!r} is not in the Unigram vocabulary and there is no unk piece")
            if s:
                ids.append(i)
        return ids

    def tokenize(self, word: str) -> list[int]:
        if not word:
            return []
        back_b, back_i = self._best_path(word)
        ids = []
        e = len(word)
        while e > 0:
            i = back_i[e]
            if i < 0:  # unknown characters on the path: fuse / byte-fallback them
                return self._to_ids(self._segments(word, back_b, back_i))
            ids.append(i)
            e = back_b[e]
        ids.reverse()
        return ids

    def sample(self, word: str, alpha: float = 0.1, rng=None) -> list[int]:
        """Subword regularisation: draw a segmentation with P(s) ∝ prod p(s_i)^alpha (forward-filtering
        backward-sampling over the lattice); alpha -> inf approaches Viterbi, alpha -> 0 uniform."""
        import random

        rng = rng or random.Random()
        n = len(word)
        if n == 0:
            return []
        ends = self._lattice(word)
        fwd = [0.0] + [-math.inf] * n
        for e in range(1, n + 1):
            xs = [fwd[b] + alpha * s for b, _, s in ends[e]]
            m = max(xs)
            fwd[e] = m + math.log(sum(math.exp(x - m) for x in xs))
        segs = []
        e = n
        while e > 0:
            xs = [fwd[b] + alpha * s - fwd[e] for b, _, s in ends[e]]
            r, acc, pick = rng.random(), 0.0, len(xs) - 1
            for k, x in enumerate(xs):
                acc += math.exp(x)
                if r < acc:
                    pick = k
                    break
            b, i, _ = ends[e][pick]
            segs.append((word[b:e], i))
            e = b
        segs.reverse()
        return self._to_ids(segs)

    def to_json(self) -> dict:
        return {"type": "Unigram", "unk_id": self.unk_id, "vocab": [[p, s] for p, s in self.pieces],
                "byte_fallback": self.byte_fallback}

    @classmethod
    def from_json(cls, d: dict) -> "UnigramModel":
        return cls([(p, s) for p, s in d["vocab"]], d.get("unk_id"), bool(d.get("byte_fallback", False)))


# ------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------
def _code_points(words: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """All words' code points concatenated (uint32) and each word's length."""
    codes = np.frombuffer("".join(words).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    return codes, np.fromiter(map(len, words), dtype=np.int64, count=len(words))


def kept_characters(word_counts: dict[str, int], coverage: float) -> set[str]:
    """Most frequent characters whose counts cover ``coverage`` of all characters ('▁' always kept);
    ties by code point. Counted with one weighted ``bincount`` over the code points."""
    words = list(word_counts)
    codes, lengths = _code_points(words)
    freq = np.bincount(codes, weights=np.repeat(np.fromiter(word_counts.values(), dtype=np.float64, count=len(words)),
                                                 lengths))
    chars = np.flatnonzero(freq)
    chars = chars[np.argsort(-freq[chars], kind="stable")]  # by count descending, then code point
    before = np.concatenate([[0.0], np.cumsum(freq[chars])[:-1]])  # characters covered before each one
    stop = np.flatnonzero(before[1:] >= coverage * freq.sum())  # the first one not needed any more
    n = int(stop[0]) + 1 if stop.size else chars.size
    return {chr(c) for c in chars[:n].tolist()} | {META}


def split_uncovered(word_counts: dict[str, int], kept: set[str], max_len: int) -> dict[str, int]:
    """Cut words at characters outside ``kept`` (pieces cannot contain them) and into <= max_len chunks.
    Only the words that need it (found by one vectorised pass over the code points) are cut in Python."""
    words = list(word_counts)
    codes, lengths = _code_points(words)
    lut = np.zeros(max(int(codes.max(initial=0)), max(map(ord, kept), default=0)) + 1, dtype=bool)
    lut[[ord(ch) for ch in kept]] = True
    bad = np.zeros(len(words), dtype=bool)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    nonempty = np.flatnonzero(lengths)
    bad[nonempty] = np.logical_or.reduceat(~lut[codes], starts[nonempty]) if codes.size else False
    bad |= (lengths > max_len) | (lengths == 0)
    counts = list(word_counts.values())
    out = {w: c for w, c, b in zip(words, counts, bad.tolist()) if not b}
    uncovered = np.unique(codes[~lut[codes]]).tolist()
    cut = re.compile("[" + "".join(re.escape(chr(c)) for c in uncovered) + "]+").split if uncovered else None
    for k in np.flatnonzero(bad).tolist():
        for run in cut(words[k]) if cut else (words[k],):
            for i in range(0, len(run), max_len):
                out[run[i:i + max_len]] = out.get(run[i:i + max_len], 0) + counts[k]
    return out


_B1 = np.uint64(1_000_003)
_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: an odd multiplier spreads small hashes over the top bits
_B2 = np.uint64(0x9E3779B97F4A7C15)


# ISO 15924 codes of the Unicode scripts (``regex``'s \p{sc=...} names); Zyyy = Common (punctuation,
# digits, symbols), Zinh = Inherited (combining marks)
_SCRIPT_CODES = (
    "Zyyy Latn Bopo Zinh Grek Copt Cyrl Armn Hebr Arab Syrc Thaa Nkoo Samr Mand Deva Beng Guru Gujr Orya Taml "
    "Telu Knda Mlym Sinh Thai Laoo Tibt Mymr Geor Hang Ethi Cher Cans Ogam Runr Tglg Hano Buhd Tagb Khmr Mong "
    "Limb Tale Talu Bugi Lana Bali Sund Batk Lepc Olck Brai Glag Tfng Hani Hira Kana Yiii Lisu Vaii Bamu Sylo "
    "Phag Saur Kali Rjng Java Cham Tavt Mtei Linb Lyci Cari Ital Goth Perm Ugar Xpeo Dsrt Shaw Osma Osge Elba "
    "Aghb Vith Todr Lina Cprt Armi Palm Nbat Hatr Phnx Lydi Sidt Mero Merc Khar Sarb Narb Mani Avst Prti Phli "
    "Phlp Orkh Hung Rohg Gara Yezi Sogo Sogd Ougr Chrs Elym Brah Kthi Sora Cakm Mahj Shrd Khoj Mult Sind Gran "
    "Tutg Newa Tirh Sidd Modi Takr Ahom Dogr Wara Diak Nand Zanb Soyo Pauc Sunu Bhks Marc Gonm Gong Tols Maka "
    "Kawi Xsux Pcun Cpmn Egyp Hluw Gukh Mroo Tnsa Bass Hmng Krai Medf Berf Miao Tang Nshu Kits Jurc Dupl Sgnw "
    "Hmnp Toto Wcho Nagm Onao Tayo Mend Adlm"
).split()
_SCRIPT_RE = None


def script_classes(chars) -> dict[str, int]:
    """sentencepiece's script of each character, as an int: Hiragana, Katakana and U+30FC count as Han;
    -2 = Inherited (a combining mark: takes the script of the character before it); '▁' = -1; 0 =
    unknown; the others are 1 + their index in ``_SCRIPT_CODES`` (Common = 1: digits, punctuation)."""
    global _SCRIPT_RE
    if _SCRIPT_RE is None:
        known = []
        for c in _SCRIPT_CODES:  # a script the installed `regex` does not know is left out (class 0)
            try:
                regex.compile(rf"\p{{sc={c}}}")
                known.append(c)
            except regex.error:
                pass
        _SCRIPT_RE = regex.compile("|".join(rf"(?P<{c}>\p{{sc={c}}})" for c in known))
    han = 1 + _SCRIPT_CODES.index("Hani")
    out = {}
    for ch in chars:
        m = _SCRIPT_RE.match(ch)
        sc = m.lastgroup if m else None
        if ch == META:
            out[ch] = -1
        elif sc == "Zinh":
            out[ch] = -2
        elif sc in ("Hira", "Kana") or ch == "\u30fc":
            out[ch] = han
        else:
            out[ch] = 0 if sc is None else 1 + _SCRIPT_CODES.index(sc)
    return out


def script_breaks(strings: list[str]) -> np.ndarray:
    """Per position of the concatenated strings: how many script changes lie between its string's first
    character and it (sentencepiece's rule: a piece holds one script, and '▁' only as its first
    character). A character breaks from the one before it if it is '▁', or if its script differs from
    that of the one before it and that one is not '▁' (a combining mark takes the script before it, or,
    first or after '▁', the one after it).
    Substring [b, e) is a valid piece iff ``breaks[e - 1] == breaks[b]``."""
    codes, lengths = _code_points(strings)
    if not codes.size:
        return np.zeros(0, dtype=np.int32)
    uniq = np.flatnonzero(np.bincount(codes))
    cls_of = script_classes([chr(c) for c in uniq.tolist()])
    lut = np.zeros(int(uniq[-1]) + 1, dtype=np.int32)
    lut[uniq] = [cls_of[chr(c)] for c in uniq.tolist()]
    cls = lut[codes]
    first = np.zeros(codes.size, dtype=bool)
    first[np.concatenate([[0], np.cumsum(lengths)[:-1]])[lengths > 0]] = True
    while True:  # combining marks take the script of the character before them (chains: repeat) ...
        inh = np.flatnonzero((cls == -2) & ~first)
        inh = inh[(cls[inh - 1] != -2) & (cls[inh - 1] != -1)]
        if not inh.size:
            break
        cls[inh] = cls[inh - 1]
    last = np.zeros(codes.size, dtype=bool)
    last[np.cumsum(lengths)[lengths > 0] - 1] = True
    while True:  # ... or, first in the string or after '▁' (where sentencepiece has no script yet), the one after
        inh = np.flatnonzero((cls == -2) & ~last)
        inh = inh[(cls[inh + 1] != -2) & (cls[inh + 1] != -1)]
        if not inh.size:
            break
        cls[inh] = cls[inh + 1]
    brk = np.zeros(codes.size, dtype=np.int32)
    brk[1:] = (cls[1:] == -1) | ((cls[:-1] != -1) & (cls[1:] != cls[:-1]))
    brk[first] = 0
    cum = np.cumsum(brk, dtype=np.int64)
    base = np.repeat(cum[first] - brk[first], lengths[lengths > 0])  # the count before each string
    return (cum - base).astype(np.int32)


def _hash_powers(max_len: int) -> tuple[np.ndarray, np.ndarray]:
    P1 = np.ones(max_len + 1, dtype=np.uint64)
    P2 = np.ones(max_len + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for l in range(1, max_len + 1):
            P1[l] = P1[l - 1] * _B1
            P2[l] = P2[l - 1] * _B2
    return P1, P2


def length_groups(strings: list[str], max_len: int, max_cells: int | None = None):
    """Strings bucketed by length n (ascending), optionally in chunks of rows: yields (idx, n, H1, H2) with
    ``idx`` the strings' indices (int32, ascending) and ``H[:, c]`` the polynomial hash of each string's first
    c characters, so ``H[:, j] - H[:, i] * B**(j-i)`` hashes s[i:j] for all rows at once. With
    ``max_cells``, a chunk holds at most max(1, max_cells // (n * min(n, max_len))) rows."""
    by_len: dict[int, list[int]] = defaultdict(list)
    for k, s in enumerate(strings):
        by_len[len(s)].append(k)
    for n, idx in sorted(by_len.items()):
        if n == 0:
            continue
        step = len(idx) if max_cells is None else max(1, max_cells // (n * min(n, max_len)))
        for lo in range(0, len(idx), step):
            part = idx[lo:lo + step]
            with np.errstate(over="ignore"):
                codes = np.frombuffer("".join(strings[k] for k in part).encode("utf-32-le", "surrogatepass"),
                                      dtype=np.uint32).reshape(len(part), n).astype(np.uint64) + np.uint64(1)
                H1 = np.zeros((len(part), n + 1), dtype=np.uint64)
                H2 = np.zeros((len(part), n + 1), dtype=np.uint64)
                for c in range(n):
                    H1[:, c + 1] = H1[:, c] * _B1 + codes[:, c]
                    H2[:, c + 1] = H2[:, c] * _B2 + codes[:, c]
            yield np.array(part, dtype=np.int32), n, H1, H2


def string_hashes(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(h1, h2) of each whole string, the same hashes :func:`iter_substrings` gives its substrings."""
    h1, h2 = np.zeros(len(strings), dtype=np.uint64), np.zeros(len(strings), dtype=np.uint64)
    for idx, n, H1, H2 in length_groups(strings, max(1, max(map(len, strings), default=1))):
        h1[idx], h2[idx] = H1[:, n], H2[:, n]
    return h1, h2


def _block_hashes(H1, H2, P1, P2, l: int):
    """Hashes of all length-l substrings of a length group: two (rows * (n + 1 - l),) arrays, row-major."""
    m = H1.shape[1] - l
    with np.errstate(over="ignore"):
        return (H1[:, l:] - H1[:, :m] * P1[l]).ravel(), (H2[:, l:] - H2[:, :m] * P2[l]).ravel()


def iter_substrings(strings: list[str], max_len: int, breaks: np.ndarray | None = None):
    """Every substring of length <= max_len of every string, yielded in blocks (sid, begin, length, h1, h2).

    h1, h2 are two polynomial hashes mod 2^64 (bases 1000003 and 0x9E37...): the substring's identity
    without materialising millions of Python strings (see :func:`length_groups`). One block per (string
    length, substring length), so memory stays bounded by the largest block. With ``breaks``
    (:func:`script_breaks`), only the substrings that are valid pieces (one script) are yielded."""
    P1, P2 = _hash_powers(max_len)
    if breaks is not None:
        starts = np.concatenate([[0], np.cumsum([len(w) for w in strings])[:-1]]).astype(np.int64)
    for idx, n, H1, H2 in length_groups(strings, max_len):
        if breaks is not None:
            brk = breaks[starts[idx][:, None] + np.arange(n)]  # (rows, n)
        for l in range(1, min(max_len, n) + 1):
            m = n + 1 - l
            h1, h2 = _block_hashes(H1, H2, P1, P2, l)
            sid, beg = np.repeat(idx, m), np.tile(np.arange(m, dtype=np.int32), idx.size)
            if breaks is not None and l > 1:
                ok = (brk[:, l - 1:] == brk[:, :m]).ravel()  # no script break inside the substring
                sid, beg, h1, h2 = sid[ok], beg[ok], h1[ok], h2[ok]
            yield sid, beg, l, h1, h2


def _reduce_sorted(h1, h2, w, ln):
    """Group equal h1 (after sorting): summed weight, first h2 and length; raise if equal h1 has two h2."""
    order = np.argsort(h1)
    h1 = h1[order]
    new = np.empty(h1.size, dtype=bool)
    new[:1] = True
    np.not_equal(h1[1:], h1[:-1], out=new[1:])
    gstart = np.flatnonzero(new)
    del new
    h2 = h2[order]
    _check_collisions(h1, h2, gstart)
    return h1[gstart], h2[gstart], np.add.reduceat(w[order], gstart), ln[order][gstart]


def count_substrings(strings: list[str], counts: np.ndarray, max_len: int, keep_top: int | None = None,
                     n_buckets: int = 64, min_reduce: int = 1 << 20, threads: int = 2,
                     breaks: np.ndarray | None = None):
    """Distinct substrings (length <= max_len) with their total count weighted by ``counts``: arrays
    (h1, top 32 bits of h2, count, length), in no particular order. With ``keep_top``, only single characters and the ``keep_top``
    multi-character substrings of count >= 2 with the largest count * length (plus ties) are returned.

    Occurrences are routed by the top bits of ``h1 * _MIX`` into ``n_buckets`` hash buckets; a bucket is reduced
    (sort + segment sums) when its pending occurrences reach its reduced size (at least ``min_reduce``),
    so every occurrence is sorted about twice and only inside its bucket. A bucket's counts are final
    once all strings are seen, so the top-k filter runs bucket by bucket and the peak memory is the
    distinct substrings (h1, h2's top half, count as uint32 where exact, length: 17 bytes each), never
    all occurrences. With ``threads`` > 1, each thread owns a contiguous range of buckets (it hashes
    every substring and keeps those routed to its buckets); the union of the threads' top-k (+ ties)
    holds the global top-k (+ ties), so the result is the same for any thread count. With ``breaks``
    (:func:`script_breaks`) only valid pieces (one script each) are counted."""
    if not any(strings):
        raise UserError("cannot train a Unigram tokenizer on an empty corpus")
    bits = max(1, int(n_buckets - 1).bit_length())
    n_buckets = 1 << bits
    shift = np.uint64(64 - bits)
    threads = max(1, min(threads, n_buckets))
    # weights as uint32 when no substring's total can reach 2^32 (bounded by the corpus's characters)
    exact32 = float(np.dot(counts, [len(s) for s in strings])) < 2**32 - 1
    counts = counts.astype(np.uint32) if exact32 else counts.astype(np.float64)

    def buckets(j_lo: int, j_hi: int) -> list[tuple]:
        state: dict[int, tuple] = {}
        pend: dict[int, list] = defaultdict(list)
        n_pend: dict[int, int] = defaultdict(int)

        def reduce(j):
            parts = ([state[j]] if j in state else []) + pend.pop(j)
            state[j] = _reduce_sorted(*(np.concatenate([p[i] for p in parts]) for i in range(4)))
            n_pend[j] = 0

        for sid, _, l, h1, h2 in iter_substrings(strings, max_len, breaks):
            with np.errstate(over="ignore"):
                b = ((h1 * _MIX) >> shift).astype(np.uint8 if bits <= 8 else np.uint16)  # mixed: short strings' hashes are small
            if threads > 1:
                mine = np.flatnonzero((b >= j_lo) & (b < j_hi))
                sid, h1, h2, b = sid[mine], h1[mine], h2[mine], b[mine]
            h2 = (h2 >> np.uint64(32)).astype(np.uint32)  # the collision check keeps h2's top 32 bits
            order = np.argsort(b, kind="stable")  # radix sort of small keys
            cuts = np.concatenate([[0], np.cumsum(np.bincount(b, minlength=n_buckets))]).tolist()
            h1, h2, w = h1[order], h2[order], counts[sid[order]]
            ln = np.full(order.size, l, dtype=np.int8)
            del order, b
            for j in range(j_lo, j_hi):
                lo, hi = cuts[j], cuts[j + 1]
                if hi > lo:
                    pend[j].append((h1[lo:hi], h2[lo:hi], w[lo:hi], ln[lo:hi]))
                    n_pend[j] += hi - lo
                    if n_pend[j] >= max(min_reduce, state[j][0].size if j in state else 0):
                        reduce(j)
        out: list[tuple] = []
        n_out = 0
        for j in range(j_lo, j_hi):
            if pend.get(j):
                reduce(j)
            st = state.pop(j, None)
            if st is None:
                continue
            if keep_top is not None:
                h1, h2, w, ln = st
                sel = np.flatnonzero((ln == 1) | (w >= 2))
                st = tuple(a[sel] for a in st)
            out.append(st)
            n_out += st[0].size
            if keep_top is not None and n_out > 2 * keep_top + (1 << 16):  # keep the running top-k (+ ties) only
                out = [_top_substrings(*(np.concatenate([o[i] for o in out]) for i in range(4)), keep_top)]
                n_out = out[0][0].size
        return out

    ranges = [(t * n_buckets // threads, (t + 1) * n_buckets // threads) for t in range(threads)]
    if threads > 1:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            outs = list(pool.map(lambda r: buckets(*r), ranges))
    else:
        outs = [buckets(*ranges[0])]
    res = tuple(np.concatenate([o[i] for out in outs for o in out]) for i in range(4))
    return res if keep_top is None else _top_substrings(*res, keep_top)


def _top_substrings(h1, h2, w, ln, k):
    """All single characters plus the k multi-character substrings of count >= 2 with the largest
    count * length (and everything tied with the k-th)."""
    multi = np.flatnonzero((ln > 1) & (w >= 2))
    if multi.size > k:
        score = w[multi].astype(np.float64) * ln[multi]
        thr = np.partition(score, multi.size - k)[multi.size - k] if k > 0 else np.inf
        multi = multi[score >= thr]
    sel = np.sort(np.concatenate([np.flatnonzero(ln == 1), multi]))
    return h1[sel], h2[sel], w[sel], ln[sel]


class _HashIndex:
    """Exact lookup of 64-bit hashes (ids = positions in ``h1``): an open-addressing table with linear
    probing, at most a quarter full, built and queried with whole-array numpy operations. A key's home
    slot is the top bits of ``h1 * _MIX`` (a bijection mod 2^64: polynomial hashes of short strings are
    small numbers, all in slot 0 otherwise); a query costs two gathers, and only the few that land on
    another key's slot probe further. A matching h1 with another h2 is reported as a collision (``h2``
    holds the top 32 bits of the second hash). ``h1`` must be distinct."""

    def __init__(self, h1: np.ndarray, h2: np.ndarray):
        self.h1, self.h2 = h1, h2.astype(np.uint32)
        with np.errstate(over="ignore"):
            key = h1 * _MIX
        self.bits = max(8, int(max(h1.size, 1)).bit_length() + 2)
        self.mask = (1 << self.bits) - 1
        self.shift = np.uint64(64 - self.bits)
        self.keys = np.zeros(1 << self.bits, dtype=np.uint64)
        self.ids = np.full(1 << self.bits, -1, dtype=np.int32)
        pending = np.arange(h1.size)
        slot = (key >> self.shift).astype(np.int64)
        while pending.size:  # each round: every free slot wanted takes its lowest-numbered applicant
            free = self.ids[slot] < 0
            order = np.flatnonzero(free)
            order = order[np.argsort(slot[order], kind="stable")]
            first = np.ones(order.size, dtype=bool)
            np.not_equal(slot[order][1:], slot[order][:-1], out=first[1:])
            win = order[first]
            self.ids[slot[win]] = pending[win]
            self.keys[slot[win]] = key[pending[win]]
            lost = np.ones(pending.size, dtype=bool)
            lost[win] = False
            pending, slot = pending[lost], (slot[lost] + 1) & self.mask

    @classmethod
    def of_strings(cls, strings: list[str]) -> "_HashIndex":
        """The index of whole strings (ids = positions in ``strings``)."""
        h1, h2 = string_hashes(strings)
        return cls(h1, h2 >> np.uint64(32))

    def __call__(self, q1: np.ndarray, q2: np.ndarray) -> np.ndarray:
        """id of each query hash (int32), or -1."""
        if self.h1.size == 0 or q1.size == 0:
            return np.full(q1.size, -1, dtype=np.int32)
        with np.errstate(over="ignore"):
            q = q1 * _MIX
        slot = (q >> self.shift).astype(np.intp)
        out = self.ids[slot]
        hit = self.keys[slot] == q
        probe = np.flatnonzero(~hit & (out >= 0))  # the slot holds another key: the run goes on
        out[~hit] = -1
        while probe.size:
            slot_p = (slot[probe] + 1) & self.mask
            slot[probe] = slot_p
            got = self.ids[slot_p]
            ok = self.keys[slot_p] == q[probe]
            out[probe[ok]] = got[ok]
            probe = probe[~ok & (got >= 0)]
        found = np.flatnonzero(out >= 0)
        if np.any(self.h2[out[found]] != (q2[found] >> np.uint64(32)).astype(np.uint32)):
            raise RuntimeError("unigram seeding: 64-bit substring hash collision (please report this corpus)")
        return out


def _check_collisions(h1_sorted: np.ndarray, h2_sorted: np.ndarray, gstart: np.ndarray) -> None:
    if h1_sorted.size and not np.array_equal(np.minimum.reduceat(h2_sorted, gstart), np.maximum.reduceat(h2_sorted, gstart)):
        raise RuntimeError("unigram seeding: 64-bit substring hash collision (please report this corpus)")


PARALLEL_SWEEP_EDGES = 1_000_000
"""E-step: lattices with at least this many edges run the sweeps and the edge posteriors in two threads."""
POSTERIOR_CHUNK = 1 << 19
"""E-step: edge posteriors are computed and summed in chunks of this many edges (bounded scratch memory)."""


LATTICE_CHUNK_CELLS = 1 << 22
"""Lattice build: strings of one length are processed in chunks of rows whose (offset x row x length) cube
of piece ids has at most this many cells (16 MB of int32 each for the forward and the backward cube)."""


def _chunk_edges(idx, n, H1, H2, rank0, powers, max_len, lookup, exclude_full, alive, backward, pos_base):
    """The edges of one chunk of equal-length strings, already in lattice order.

    For every substring length l, the seed ids of all (row, begin) are looked up at once and written into
    a cube indexed (end offset - 1, row, max piece length - l) for the forward order and (begin, row, l - 1)
    for the backward one; the cells that hold a piece, read in memory order, are the edges sorted by end
    offset, then string, then begin ascending (backward: by begin offset, then string), with no sort.
    Position of offset k in the chunk's row r: ``pos_base[k] + rank0 + r`` (see :class:`_Lattice`).
    Returns per direction (source position of each edge, its piece, edge count per (offset, row)): the
    forward source is the begin, the backward source the end."""
    lmax = min(n, max_len) - (1 if exclude_full and n <= max_len else 0)
    rows = idx.size
    if lmax <= 0:
        return [(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros((n, rows), np.int32))] * (1 + backward)
    fwd = np.full((n, rows, lmax), -1, dtype=np.int32)
    bwd = np.full((n, rows, lmax), -1, dtype=np.int32) if backward else None
    for l in range(1, lmax + 1):
        q1, q2 = _block_hashes(H1, H2, *powers, l)
        ids = lookup(q1, q2).reshape(rows, n + 1 - l)
        del q1, q2
        if alive is not None:
            hit = ids >= 0
            v = ids[hit]
            v[~alive[v]] = -1
            ids[hit] = v
        fwd[l - 1:, :, lmax - l] = ids.T
        if backward:
            bwd[: n + 1 - l, :, l - 1] = ids.T
    out = []
    for cube, is_fwd in ((fwd, True), (bwd, False)):
        if cube is None:
            continue
        has = cube >= 0
        per_line = np.count_nonzero(has, axis=2).astype(np.int32)  # (offset, row)
        flat = cube.reshape(-1)
        cells = np.flatnonzero(has.reshape(-1))
        del has
        piece = flat[cells]
        off, rem = np.divmod(cells, rows * lmax)
        row, j = np.divmod(rem, lmax)
        del cells, rem
        row += rank0
        if is_fwd:  # end offset off + 1, length lmax - j: the begin's position
            src = pos_base[off + 1 - lmax + j] + row
        else:  # begin offset off, length j + 1: the end's position
            src = pos_base[off + 1 + j] + row
        out.append((src.astype(np.int32), piece, per_line))
    return out


class _Slice:
    """One sweep step: the edges [lo, hi) whose destination offset is ``k``, in groups of one destination
    each: ``gs`` (group starts, relative to lo) and ``sizes``. Group g's destination is the position of
    (offset k, rank ``r0 + g``): positions ``dest`` = pos_base[k] + [r0, r0 + G), one contiguous block."""

    __slots__ = ("k", "lo", "hi", "gs", "sizes", "dest", "r0")

    def __init__(self, k: int, lo: int, sizes: np.ndarray, d0: int, r0: int):
        self.k, self.lo, self.hi, self.sizes = k, lo, lo + int(sizes.sum()), sizes
        self.gs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32)
        self.dest, self.r0 = slice(d0, d0 + sizes.size), r0


class _Lattice:
    """All strings' lattices as one edge list over a flat position space, so forward, backward and
    Viterbi are one vectorised step per offset inside a string, over all strings at once.

    Positions are laid out offset-major: strings ranked by (length, index), and the positions at offset k
    of all strings at least k long form one contiguous block, in rank order (``pos_base[k] + rank``).
    Every position has its single-character edge, so a sweep step (all edges ending at offset k, or
    starting at offset k backward) has one group per string in rank order and writes one contiguous
    block: an edge is stored as its source position and piece only (8 bytes per direction), its
    destination and string being implied by its group (:class:`_Slice`).

    Forward order: by end offset, then destination, then begin ascending (a Viterbi tie keeps the first
    = longest last piece, the encoder's rule; a group's last edge is its single character). Backward
    order (what the beta sweep reads): by begin offset descending, then begin, then length ascending (a
    group's first edge is its single character). The edges are every occurrence of a piece known to
    ``lookup`` in ``strings``, produced directly in both orders by :func:`_chunk_edges` (no sort).

    Pieces only ever die, so :meth:`drop_dead` compacts the edges in place (no second full copy) and only
    when enough of them are dead; until then a dead piece's ``logp = -inf`` gives its edges zero weight
    (the single-character edges are never dead, so no group is all ``-inf``).
    """

    def __init__(self, strings: list[str], max_len: int, lookup, counts, *, exclude_full: bool = False,
                 alive: np.ndarray | None = None, backward: bool = True, chunk_cells: int | None = None,
                 threads: int = 2):
        """Edges = occurrences in ``strings`` of the pieces ``lookup(h1, h2) -> id`` knows (length <= max_len;
        not a whole string with ``exclude_full``; only pieces with ``alive[id]`` if given). Every single
        character of every string must be such a piece (so with ``exclude_full`` strings are >= 2 long)."""
        lengths = np.array([len(w) for w in strings], dtype=np.int64)
        if exclude_full and lengths.size and lengths.min() < 2:
            raise ValueError("unigram lattice: exclude_full needs strings of at least 2 characters")
        self.npos = int(lengths.sum() + lengths.size)
        if self.npos >= 2**31 - 1:
            raise UserError("unigram: corpus too large for one lattice (over 2^31 character positions)")
        self.by_len = np.argsort(lengths, kind="stable")  # rank -> string
        self.rank = np.empty(lengths.size, dtype=np.int64)
        self.rank[self.by_len] = np.arange(lengths.size)
        span = int(lengths.max(initial=0))
        self.at_least = lengths.size - np.searchsorted(lengths[self.by_len], np.arange(span + 2))  # strings >= k long
        self.first_rank = lengths.size - self.at_least  # rank of the first string at least k long
        # position of (offset k, rank r) = start of block k + (r - first rank in block k)
        self.pos_base = np.concatenate([[0], np.cumsum(self.at_least)[:-1]]) - self.first_rank
        self.starts = self.pos_base[0] + self.rank
        self.ends = self.pos_base[lengths] + self.rank
        self.counts = np.asarray(counts, dtype=np.float64)
        self.backward, self.threads = backward, threads
        powers = _hash_powers(max_len)

        def chunk(group):
            return _chunk_edges(*group, powers, max_len, lookup, exclude_full, alive, backward, self.pos_base)

        def groups():
            r = 0
            for idx, n, H1, H2 in length_groups(strings, max_len, chunk_cells or LATTICE_CHUNK_CELLS):
                yield idx, n, H1, H2, r
                r += idx.size

        if threads > 1:  # chunks are independent and numpy releases the GIL: results kept in chunk order
            with ThreadPoolExecutor(max_workers=threads) as pool:
                parts = list(pool.map(chunk, groups()))
        else:
            parts = list(map(chunk, groups()))
        # forward step k = 1..span reads the edges ending at offset k; backward step b = span-1..0 those
        # starting at offset b; a chunk of strings of length n takes part in steps k <= n (b < n)
        self.src, self.ep, self.f_slices = self._assemble(parts, 0, [(k, k - 1) for k in range(1, span + 1)], "forward")
        if backward:
            self.b_src, self.b_ep, self.b_slices = self._assemble(
                parts, 1, [(b, b) for b in range(span - 1, -1, -1)], "backward")
        else:
            self.b_src = self.b_ep = self.b_slices = None

    def _assemble(self, parts, d, steps, what):
        """Concatenate the chunks' edges of direction ``d`` in (step, chunk) order; one slice per step."""
        cuts = [np.concatenate([[0], np.cumsum(p[d][2].sum(axis=1))]).tolist() for p in parts]
        pick, slices, lo = [], [], 0
        for k, o in steps:  # destination offset k, cube row o
            first = k + (d == 1)  # the strings with a group: at least `first` characters long
            sizes = [p[d][2][o] for p in parts if o < p[d][2].shape[0]]
            sizes = np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int32)
            if sizes.size != self.at_least[first] or (sizes.size and sizes.min() == 0):
                raise ValueError(f"unigram lattice: a {what} position has no edge (every character must be a piece)")
            pick += [(ci, cuts[ci][o], cuts[ci][o + 1]) for ci, p in enumerate(parts) if o < p[d][2].shape[0]]
            r0 = int(self.first_rank[first])
            slices.append(_Slice(k, lo, sizes, int(self.pos_base[k] + r0), r0))
            lo = slices[-1].hi
        cols = []
        for a in range(2):
            cols.append(np.concatenate([parts[ci][d][a][l:h] for ci, l, h in pick]) if pick else np.zeros(0, np.int32))
            for p in parts:  # free each chunk's column once it is copied
                p[d] = (None, p[d][1], p[d][2]) if a == 0 else (None, None, p[d][2])
        return cols[0], cols[1], slices

    def edges(self, forward: bool = True):
        """(string, begin offset, end offset, piece) of every edge, in the direction's order (for tests and
        inspection: the sweeps never need it)."""
        src, ep, slices = (self.src, self.ep, self.f_slices) if forward else (self.b_src, self.b_ep, self.b_slices)
        if not slices or not src.size:
            z = np.zeros(0, dtype=np.int64)
            return z, z, z, z
        rank = np.concatenate([np.repeat(np.arange(sl.r0, sl.r0 + sl.sizes.size), sl.sizes) for sl in slices])
        k = np.concatenate([np.full(sl.hi - sl.lo, sl.k) for sl in slices])
        span = len(self.pos_base) - 2
        k_src = np.searchsorted(self.pos_base[: span + 1], src - rank)  # pos_base is increasing up to the span
        begin, end = (k_src, k) if forward else (k, k_src)
        return self.by_len[rank], begin, end, ep.astype(np.int64)

    def string_and_end(self, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """String and end offset of the forward edges ``e``."""
        e = np.asarray(e, dtype=np.int64)
        los = np.array([sl.lo for sl in self.f_slices], dtype=np.int64)
        which = np.searchsorted(los, e, side="right") - 1
        string, end = np.empty(e.size, dtype=np.int64), np.empty(e.size, dtype=np.int64)
        for i in np.unique(which).tolist():
            sel = np.flatnonzero(which == i)
            sl = self.f_slices[i]
            g = np.searchsorted(sl.gs, e[sel] - sl.lo, side="right") - 1
            string[sel], end[sel] = self.by_len[sl.r0 + g], sl.k
        return string, end

    def drop_dead(self, piece_alive: np.ndarray, min_fraction: float = 0.0) -> None:
        """Remove the edges of dead pieces if at least ``min_fraction`` of the edges are dead."""
        keep = piece_alive[self.ep]
        n_dead = keep.size - int(np.count_nonzero(keep))
        if n_dead == 0 or n_dead < min_fraction * keep.size:
            return
        self.src, self.ep, self.f_slices = self._compact(keep, self.src, self.ep, self.f_slices)
        if self.backward:
            keep = piece_alive[self.b_ep]
            self.b_src, self.b_ep, self.b_slices = self._compact(keep, self.b_src, self.b_ep, self.b_slices)
        del keep
        release_memory()

    @staticmethod
    def _compact(keep, src, ep, slices):
        kept = keep.view(np.int8) if keep.dtype == bool else keep.astype(np.int8)
        new, lo = [], 0
        for sl in slices:
            sizes = np.add.reduceat(kept[sl.lo: sl.hi], sl.gs, dtype=np.int32) if sl.hi > sl.lo else sl.sizes
            if sizes.size and sizes.min() == 0:
                raise ValueError("unigram lattice: a position lost all its edges (a single-character piece died)")
            new.append(_Slice(sl.k, lo, sizes, sl.dest.start, sl.r0))
            lo = new[-1].hi
        return np.compress(keep, src), np.compress(keep, ep), new

    def _sweep(self, logp, forward: bool, mode: str):
        """'lse' -> log-sum-exp over paths (forward alpha / backward beta); 'max' -> Viterbi + back-pointers.

        Log-sum-exp shifts each group by its single-character edge's score (the last edge of a forward
        group, the first of a backward one), which is always finite and within max_len * |log p| of the
        group's best, instead of a max-reduction; a group whose sum overflows all the same is recomputed
        with its maximum as the shift."""
        src, ep, slices = (self.src, self.ep, self.f_slices) if forward else (self.b_src, self.b_ep, self.b_slices)
        val = np.full(self.npos, -np.inf)
        val[self.starts if forward else self.ends] = 0.0
        back = np.full(self.npos, -1, dtype=np.int64) if mode == "max" else None
        n_max = max((sl.hi - sl.lo for sl in slices), default=0)
        xbuf, ybuf = np.empty(n_max), np.empty(n_max)  # scratch reused by every step
        for sl in slices:
            lo, hi, gs, sizes = sl.lo, sl.hi, sl.gs, sl.sizes
            x, y = xbuf[: hi - lo], ybuf[: hi - lo]
            np.take(val, src[lo:hi], out=x, mode="clip")  # score of the path to each edge's source
            np.take(logp, ep[lo:hi], out=y, mode="clip")  # (indices are in range: 'clip' skips a copy)
            x += y
            if mode == "lse":
                m = x[gs + sizes - 1] if forward else x[gs]
                np.subtract(x, np.repeat(m, sizes), out=y)
                np.exp(y, out=y)
                s = np.add.reduceat(y, gs)
                np.log(s, out=s)
                s += m
                bad = np.flatnonzero(~np.isfinite(s))
                if bad.size:  # a sum overflowed (or the shift was -inf): shift those groups by their maximum
                    mx = np.maximum.reduceat(x, gs)[bad]
                    for g, shift in zip(bad.tolist(), mx.tolist()):
                        xs = x[gs[g]: gs[g] + sizes[g]]
                        s[g] = shift + math.log(float(np.exp(xs - shift).sum())) if shift > -math.inf else -math.inf
                val[sl.dest] = s
            else:
                m = np.maximum.reduceat(x, gs)  # (groups,)
                gid = np.repeat(np.arange(m.size, dtype=np.int32), sizes)  # each edge's group
                idx = np.flatnonzero(x == m[gid])  # the edges at their group's maximum
                g = gid[idx]
                first = idx[np.concatenate([[True], g[1:] != g[:-1]])]  # the first of each group
                val[sl.dest] = m
                back[sl.dest] = lo + first
        return val, back

    def expected_counts(self, logp, n_pieces):
        """Expected count of every piece (posterior edge marginals weighted by string counts) and the
        corpus log-likelihood sum_w count_w * log Z_w.

        Lattices of at least ``PARALLEL_SWEEP_EDGES`` edges use two threads (numpy releases the GIL in
        its array loops): the forward and backward sweeps are independent given log p, and so are the
        posteriors of different edges. The edges are always summed in the same pieces (forward steps, cut
        into chunks of ``POSTERIOR_CHUNK``), in order, so the result does not depend on the thread count."""
        pool = ThreadPoolExecutor(max_workers=2) if self.threads > 1 and self.src.size >= PARALLEL_SWEEP_EDGES else None
        try:
            if pool is not None:
                backward = pool.submit(self._sweep, logp, False, "lse")
                alpha, _ = self._sweep(logp, True, "lse")
                beta, _ = backward.result()
            else:
                alpha, _ = self._sweep(logp, True, "lse")
                beta, _ = self._sweep(logp, False, "lse")
            z = alpha[self.ends]
            with np.errstate(divide="ignore"):
                log_weight = (np.log(self.counts) - z)[self.by_len]  # per rank: log(count / Z)
            local = threading.local()  # one scratch buffer per thread

            def part(job) -> np.ndarray:  # (P,) expected counts from groups [g0, g1) of one forward step
                sl, g0, g1 = job
                lo, hi = sl.lo + int(sl.gs[g0]), (sl.lo + int(sl.gs[g1]) if g1 < sl.gs.size else sl.hi)
                if not hasattr(local, "buf") or local.buf.shape[1] < hi - lo:
                    local.buf = np.empty((2, max(hi - lo, POSTERIOR_CHUNK)))
                post, tmp = local.buf[0, : hi - lo], local.buf[1, : hi - lo]
                # posterior of each edge: alpha(begin) * p(piece) * beta(end) * count / Z, the last two per
                # group ('clip': the indices are in range, and it spares numpy a copy)
                np.take(alpha, self.src[lo:hi], out=post, mode="clip")
                post += np.take(logp, self.ep[lo:hi], out=tmp, mode="clip")
                d = slice(sl.dest.start + g0, sl.dest.start + g1)
                post += np.repeat(beta[d] + log_weight[sl.r0 + g0: sl.r0 + g1], sl.sizes[g0:g1])
                np.exp(post, out=post)
                return np.bincount(self.ep[lo:hi], weights=post, minlength=n_pieces)

            # jobs: runs of whole groups, about POSTERIOR_CHUNK edges each
            jobs = []
            for sl in self.f_slices:
                per = max(1, POSTERIOR_CHUNK * sl.sizes.size // max(1, sl.hi - sl.lo))
                jobs += [(sl, g, min(g + per, sl.sizes.size)) for g in range(0, sl.sizes.size, per)]
            expected = np.zeros(n_pieces)
            for c in (pool.map(part, jobs) if pool is not None else map(part, jobs)):
                expected += c  # fixed order: the same sums whatever the thread count
        finally:
            if pool is not None:
                pool.shutdown()
        return expected, float((z * self.counts).sum())

    def viterbi_paths(self, logp, string_alive: np.ndarray | None = None):
        """(string index, piece) for every piece on every (alive) string's best path."""
        _, back = self._sweep(logp, True, "max")
        cur = self.ends.copy()
        wid = np.arange(cur.size)
        ws, ps = [], []
        active = (cur > self.starts) & (back[cur] >= 0)  # strings without any edges skipped
        if string_alive is not None:
            active &= string_alive
        while active.any():
            wid, cur = wid[active], cur[active]
            e = back[cur]
            ws.append(wid)
            ps.append(self.ep[e])
            cur = self.src[e]
            active = cur > self.starts[wid]
        if not ws:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(ws), np.concatenate(ps)


def train_unigram(word_counts: dict[str, int], vocab_size: int, *, n_reserved: int = 0,
                  character_coverage: float = 0.9995, seed_size: int | None = None, max_piece_length: int = 16,
                  shrinking_factor: float = 0.75, n_sub_iterations: int = 2, max_word_length: int = 32,
                  split_by_script: bool = True, threads: int = 2, log=None) -> list[tuple[str, float]]:
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
    kept = kept_characters(word_counts, character_coverage)
    wc = split_uncovered(word_counts, kept, max_word_length)
    words = sorted(wc)
    counts = np.array([wc[w] for w in words], dtype=np.float64)
    chars = sorted({ch for w in words for ch in w})
    if target < len(chars):
        raise UserError(f"unigram: --vocab-size {vocab_size} is below the alphabet size ({len(chars)} characters at "
                        f"character coverage {character_coverage} + {n_reserved} reserved pieces); raise the vocab "
                        f"size or lower the character coverage")
    seed_size = seed_size or min(1_000_000, max(10 * target, 50_000))
    L = max_piece_length

    # --- seeds: all characters + frequent substrings, scored count * length --------------------
    n_multi = max(0, seed_size - len(chars))
    uh1, uh2, ufreq, ulen = count_substrings(words, counts, L, keep_top=n_multi, threads=threads,
                                             breaks=script_breaks(words) if split_by_script else None)
    ufreq = ufreq.astype(np.float64)
    char_u = np.flatnonzero(ulen == 1)
    char_u = char_u[np.argsort(uh1[char_u])]  # a character's hash is its code point + 1: by h1 = by character
    multi_u = np.flatnonzero(ulen > 1)
    multi_u = multi_u[np.lexsort((uh1[multi_u], -(ufreq[multi_u] * ulen[multi_u])))][:n_multi]
    seed_u = np.concatenate([char_u, multi_u])
    P = seed_u.size
    n_chars = char_u.size
    is_char = np.zeros(P, dtype=bool)
    is_char[:n_chars] = True
    seed_len = ulen[seed_u].astype(np.int64)
    freq0 = ufreq[seed_u] * np.where(is_char, 1, seed_len)
    logp = np.log(freq0) - np.log(freq0.sum())
    lookup = _HashIndex(uh1[seed_u], uh2[seed_u])
    del uh1, uh2, ufreq, ulen
    release_memory()

    corpus = _Lattice(words, L, lookup, counts, threads=threads)
    where = np.zeros(P, dtype=np.int64)
    where[corpus.ep] = np.arange(corpus.ep.size)  # some occurrence of every seed: its string
    sid, end = corpus.string_and_end(where)
    strs = [words[k][e - n:e] for k, e, n in zip(sid.tolist(), end.tolist(), seed_len.tolist())]
    del where, sid, end
    release_memory()
    # the pieces' own lattices (without the full-span edge, so: their alternative segmentations) are
    # built at the first prune, for the pieces EM left alive (a fraction of the seeds)
    alt_lat = multi_ids = None

    alive = np.ones(P, dtype=bool)
    desired = int(target * 1.1)
    round_ = 0
    while True:
        for _ in range(n_sub_iterations):  # EM
            expected, ll = corpus.expected_counts(logp, P)
            drop = alive & ~is_char & (expected < 0.5)
            if drop.any():
                alive &= ~drop
                corpus.drop_dead(alive, 0.2)
            freq = np.where(alive, np.maximum(expected, np.where(is_char, 1.0, 0.0)), 0.0)
            lp = np.full(P, -np.inf)
            lp[alive] = digamma(freq[alive]) - digamma(np.array([freq[alive].sum()]))[0]
            logp = lp
        n_alive = int(alive.sum())
        if log:
            log(f"unigram round {round_}: {n_alive} pieces, log-likelihood {ll:.6g}")
        round_ += 1
        if n_alive <= desired:
            break
        # --- prune: Viterbi frequencies and per-piece loss of removing it --------------------
        wid, pid = corpus.viterbi_paths(logp)
        vfreq = np.bincount(pid, weights=corpus.counts[wid], minlength=P)
        # F_i: occurrences on Viterbi paths / number of words, as sentencepiece (its inverted index holds
        # one entry per occurrence, so a piece used twice in a word counts twice)
        F = vfreq / corpus.counts.sum()
        total = vfreq.sum()
        if alt_lat is None:
            multi_ids = np.flatnonzero(alive & ~is_char)
            multi = [strs[i] for i in multi_ids.tolist()]
            alt_lat = _Lattice(multi, L, lookup, np.ones(len(multi)), exclude_full=True, alive=alive,
                               backward=False, threads=threads)  # only Viterbi runs on it
            del lookup, multi
            release_memory()
        else:
            alt_lat.drop_dead(alive, 0.2)
        awid, apid = alt_lat.viterbi_paths(logp, alive[multi_ids])
        owner = multi_ids[awid]
        n_alt = np.bincount(owner, minlength=P).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            logsum_alt = np.log(total + vfreq * (n_alt - 1))
            lp_alt = np.bincount(owner, weights=np.log(vfreq[apid] + vfreq[owner]), minlength=P) - n_alt * logsum_alt
            lp_sp = np.log(vfreq) - np.log(total)
            loss = F * (lp_sp - lp_alt)
        removable = np.flatnonzero(alive & ~is_char & (vfreq > 0))
        new_size = max(desired, int(shrinking_factor * n_alive))
        n_keep = max(0, new_size - int((alive & is_char).sum()))
        ranked = removable[np.lexsort((removable, -loss[removable]))]
        keep = is_char & alive
        keep[ranked[:n_keep]] = True
        alive = keep
        logp = np.where(alive, logp, -np.inf)
        corpus.drop_dead(alive, 0.2)
    # --- finalise: characters plus the best-scoring pieces, sorted by score --------------------
    ids = np.flatnonzero(alive & ~is_char)
    ids = ids[np.lexsort((ids, -logp[ids]))][: max(0, target - n_chars)]
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
        text = self._LINE_START.sub("\n" + META, "\n" + text.replace(" ", META)).replace("\n", "")
        parts = Counter(text.split(META))
        parts[""] -= 1  # the text starts with '▁' (or is empty): the empty part before it is not a word
        return Counter({META + p: c for p, c in parts.items() if c > 0})


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
        from posttrain.tokenizers import pretokenize as P

        steps = ([P.UnicodeNormalizer("NFKC")] if self.nfkc else []) + (
            [P.Replace(r"\s+", " ", True)] if self.collapse_whitespace else [])
        norm = None if not steps else steps[0] if len(steps) == 1 else P.NormalizerSequence(steps)
        pre = P.Metaspace(META, "always", True)
        if self.byte_fallback:
            dec = P.DecoderSequence([P.ReplaceDecoder(META, " "), P.ByteFallbackDecoder(), P.FuseDecoder(),
                                     P.StripDecoder(" ", 1, 0)])
        else:
            dec = P.MetaspaceDecoder(META, "always", True)
        return norm, pre, dec

    def words_fn(self):
        """Per text: NFKC, whitespace runs -> ' ', Metaspace words. A batch of texts without newlines is
        counted in one pass over the texts joined by newlines (:class:`_JoinedMetaspace`)."""
        from posttrain.tokenizers.corpus import JoinedWords
        from posttrain.tokenizers.wordpiece import _Compose

        norm, pre, _ = self.components()
        return JoinedWords(_Compose(norm, pre), _JoinedMetaspace(self.nfkc, self.collapse_whitespace, _Compose(norm, pre)),
                           sep="\n", sep_free=True)

    def train(self, texts, log=None):
        from posttrain.tokenizers.corpus import count_words

        return self.train_from_counts(count_words(texts, self.words_fn(), workers=self.workers), log=log)

    def train_from_counts(self, word_counts: dict[str, int], log=None):
        from posttrain.tokenizers.bpe import special_added_tokens
        from posttrain.tokenizers.pipeline import SubwordTokenizer

        if not (0 < self.character_coverage <= 1):
            raise UserError(f"character_coverage must be in (0, 1], got {self.character_coverage}")
        specials = list(self.special_tokens)
        if self.unk_token not in specials:
            specials.insert(0, self.unk_token)
        reserved = specials + (BYTE_PIECES if self.byte_fallback else [])
        learned = train_unigram(word_counts, self.vocab_size, n_reserved=len(reserved),
                                character_coverage=self.character_coverage, seed_size=self.seed_size,
                                max_piece_length=self.max_piece_length, shrinking_factor=self.shrinking_factor,
                                n_sub_iterations=self.n_sub_iterations, split_by_script=self.split_by_script,
                                threads=min(2, self.workers or os.cpu_count() or 1), log=log)
        taken = set(reserved)
        # 12 significant digits: a JSON float that short parses exactly in every reader (serde_json's
        # default float parser is only "best effort" on 17-digit reprs, which flips Viterbi near-ties).
        pieces = [(t, 0.0) for t in reserved] + [(p, float(f"{s:.12g}")) for p, s in learned if p not in taken]
        model = UnigramModel(pieces, unk_id=specials.index(self.unk_token), byte_fallback=self.byte_fallback)
        norm, pre, dec = self.components()
        return SubwordTokenizer(model, normalizer=norm, pre_tokenizer=pre, decoder=dec,
                                added_tokens=special_added_tokens(specials), kind=self.kind)


def sample_encode(tok, text: str, alpha: float = 0.1, seed: int | None = None) -> list[int]:
    """Subword-regularised encoding of ``text`` with a Unigram ``SubwordTokenizer`` (a fresh sample per call)."""
    import random

    if not isinstance(tok.model, UnigramModel):
        raise UserError("sampling (subword regularisation) needs a Unigram tokenizer")
    rng = random.Random(seed)
    ids: list[int] = []
    for seg, sid in tok._segments(text):
        if sid is not None:
            ids.append(sid)
            continue
        for w in tok.words(seg):
            ids += tok.model.sample(w, alpha, rng)
    return ids
