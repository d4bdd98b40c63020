"""Unigram seeds: which characters a piece may hold, and the frequent substrings training starts from.

- Character coverage (``kept_characters``): the most frequent characters covering ``character_coverage``
  of the corpus (0.9995 by default, as sentencepiece); words are cut at the others (``split_uncovered``),
  which are left to byte fallback or ``<unk>`` — what makes an 8k vocabulary possible on English +
  Chinese text.
- Script splitting (``script_classes``, ``script_breaks``): a piece holds one Unicode script
  (sentencepiece's ``split_by_unicode_script``; digits and punctuation are Common, kana count as Han).
- Substring hashing: every substring (length <= max_len) is identified by two 64-bit polynomial hashes
  computed for whole length groups at once (``length_groups``, ``iter_substrings``), counted in hash
  buckets with a running top-k (``count_substrings``, on two threads, thread-count independent), and
  looked up exactly in an open-addressing table (``HashIndex``).

Oracles in the tests: a Counter of all substrings for the seed counts.
Not handled: sentencepiece's ``split_digits`` and whitespace-only pieces.
"""

from __future__ import annotations

import re
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import regex

from posttrain.errors import UserError
from posttrain.hashing import GOLDEN
from posttrain.tokenizers.symbols import METASPACE


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
    freq = np.bincount(
        codes, weights=np.repeat(np.fromiter(word_counts.values(), dtype=np.float64, count=len(words)), lengths)
    )
    chars = np.flatnonzero(freq)
    chars = chars[np.argsort(-freq[chars], kind="stable")]  # by count descending, then code point
    before = np.concatenate([[0.0], np.cumsum(freq[chars])[:-1]])  # characters covered before each one
    stop = np.flatnonzero(before[1:] >= coverage * freq.sum())  # the first one not needed any more
    n = int(stop[0]) + 1 if stop.size else chars.size
    return {chr(c) for c in chars[:n].tolist()} | {METASPACE}


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
                out[run[i : i + max_len]] = out.get(run[i : i + max_len], 0) + counts[k]
    return out


_B1 = np.uint64(1_000_003)
MIX = np.uint64(GOLDEN)  # Fibonacci hashing: an odd multiplier spreads small hashes over the top bits
_B2 = MIX


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
        if ch == METASPACE:
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


def hash_powers(max_len: int) -> tuple[np.ndarray, np.ndarray]:
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
            part = idx[lo : lo + step]
            with np.errstate(over="ignore"):
                codes = np.frombuffer(
                    "".join(strings[k] for k in part).encode("utf-32-le", "surrogatepass"), dtype=np.uint32
                ).reshape(len(part), n).astype(np.uint64) + np.uint64(1)
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


def block_hashes(H1, H2, P1, P2, l: int):
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
    P1, P2 = hash_powers(max_len)
    if breaks is not None:
        starts = np.concatenate([[0], np.cumsum([len(w) for w in strings])[:-1]]).astype(np.int64)
    for idx, n, H1, H2 in length_groups(strings, max_len):
        if breaks is not None:
            brk = breaks[starts[idx][:, None] + np.arange(n)]  # (rows, n)
        for l in range(1, min(max_len, n) + 1):
            m = n + 1 - l
            h1, h2 = block_hashes(H1, H2, P1, P2, l)
            sid, beg = np.repeat(idx, m), np.tile(np.arange(m, dtype=np.int32), idx.size)
            if breaks is not None and l > 1:
                ok = (brk[:, l - 1 :] == brk[:, :m]).ravel()  # no script break inside the substring
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


def count_substrings(
    strings: list[str],
    counts: np.ndarray,
    max_len: int,
    keep_top: int | None = None,
    n_buckets: int = 64,
    min_reduce: int = 1 << 20,
    threads: int = 2,
    breaks: np.ndarray | None = None,
):
    """Distinct substrings (length <= max_len) with their total count weighted by ``counts``: arrays
    (h1, top 32 bits of h2, count, length), in no particular order. With ``keep_top``, only single characters and the ``keep_top``
    multi-character substrings of count >= 2 with the largest count * length (plus ties) are returned.

    Occurrences are routed by the top bits of ``h1 * MIX`` into ``n_buckets`` hash buckets; a bucket is reduced
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
    threads = max(1, min(threads, n_buckets))
    # weights as uint32 when no substring's total can reach 2^32 (bounded by the corpus's characters)
    exact32 = float(np.dot(counts, [len(s) for s in strings])) < 2**32 - 1
    counts = counts.astype(np.uint32) if exact32 else counts.astype(np.float64)
    ranges = [(t * n_buckets // threads, (t + 1) * n_buckets // threads) for t in range(threads)]
    args = (strings, counts, max_len, breaks, keep_top, min_reduce, n_buckets, bits, threads)
    if threads > 1:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            outs = list(pool.map(lambda r: _count_buckets(*args, *r), ranges))
    else:
        outs = [_count_buckets(*args, *ranges[0])]
    res = tuple(np.concatenate([o[i] for out in outs for o in out]) for i in range(4))
    return res if keep_top is None else _top_substrings(*res, keep_top)


def _count_buckets(
    strings,
    counts,
    max_len: int,
    breaks,
    keep_top,
    min_reduce: int,
    n_buckets: int,
    bits: int,
    threads: int,
    j_lo: int,
    j_hi: int,
) -> list[tuple]:
    """One thread's share of :func:`count_substrings`: the reduced (h1, h2, count, length) of buckets
    [j_lo, j_hi), each filtered to its top-k (+ ties) as it completes."""
    shift = np.uint64(64 - bits)
    state: dict[int, tuple] = {}
    pend: dict[int, list] = defaultdict(list)
    n_pend: dict[int, int] = defaultdict(int)

    def reduce(j):
        parts = ([state[j]] if j in state else []) + pend.pop(j)
        state[j] = _reduce_sorted(*(np.concatenate([p[i] for p in parts]) for i in range(4)))
        n_pend[j] = 0

    for sid, _, l, h1, h2 in iter_substrings(strings, max_len, breaks):
        with np.errstate(over="ignore"):
            b = ((h1 * MIX) >> shift).astype(
                np.uint8 if bits <= 8 else np.uint16
            )  # mixed: short strings' hashes are small
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


class HashIndex:
    """Exact lookup of 64-bit hashes (ids = positions in ``h1``): an open-addressing table with linear
    probing, at most a quarter full, built and queried with whole-array numpy operations. A key's home
    slot is the top bits of ``h1 * MIX`` (a bijection mod 2^64: polynomial hashes of short strings are
    small numbers, all in slot 0 otherwise); a query costs two gathers, and only the few that land on
    another key's slot probe further. A matching h1 with another h2 is reported as a collision (``h2``
    holds the top 32 bits of the second hash). ``h1`` must be distinct."""

    def __init__(self, h1: np.ndarray, h2: np.ndarray):
        self.h1, self.h2 = h1, h2.astype(np.uint32)
        with np.errstate(over="ignore"):
            key = h1 * MIX
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
    def of_strings(cls, strings: list[str]) -> "HashIndex":
        """The index of whole strings (ids = positions in ``strings``)."""
        h1, h2 = string_hashes(strings)
        return cls(h1, h2 >> np.uint64(32))

    def __call__(self, q1: np.ndarray, q2: np.ndarray) -> np.ndarray:
        """id of each query hash (int32), or -1."""
        if self.h1.size == 0 or q1.size == 0:
            return np.full(q1.size, -1, dtype=np.int32)
        with np.errstate(over="ignore"):
            q = q1 * MIX
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
    if h1_sorted.size and not np.array_equal(
        np.minimum.reduceat(h2_sorted, gstart), np.maximum.reduceat(h2_sorted, gstart)
    ):
        raise RuntimeError("unigram seeding: 64-bit substring hash collision (please report this corpus)")
