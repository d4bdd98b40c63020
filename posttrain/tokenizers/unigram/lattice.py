"""The Unigram trainer's lattice engine: all distinct words' lattices as one flat edge list, swept in numpy.

Key insight: lay out one position per (word, offset), offset-major, so forward (alpha), backward (beta)
and Viterbi are one vectorised step per offset *inside* a word, over all words at once; edges =
(begin, end, piece), int32, produced already in sweep order by looking the seeds' hashes up
(:class:`seeds.HashIndex`) and compacted as pieces die. The E-step (expected piece counts, posterior
edge marginals weighted by word counts) and the lattice build run on two threads (numpy releases the
GIL), with results that do not depend on the thread count.

Oracles in the tests: brute-force enumeration of segmentations (expected counts, likelihood, Viterbi
paths). Not handled: lattices over 2^31 character positions (a ``UserError``).
"""

from __future__ import annotations

import ctypes
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from posttrain.errors import UserError
from posttrain.tokenizers.unigram.seeds import block_hashes, hash_powers, length_groups


def release_memory() -> None:
    """Hand freed heap pages back to the OS. glibc keeps the pages of many mid-sized freed numpy arrays
    (its mmap threshold grows after large frees), so without this the seeding phase's peak would stay
    resident through training. No-op where glibc is absent."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


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
    Position of offset k in the chunk's row r: ``pos_base[k] + rank0 + r`` (see :class:`Lattice`).
    Returns per direction (source position of each edge, its piece, edge count per (offset, row)): the
    forward source is the begin, the backward source the end."""
    lmax = min(n, max_len) - (1 if exclude_full and n <= max_len else 0)
    rows = idx.size
    if lmax <= 0:
        return [(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros((n, rows), np.int32))] * (1 + backward)
    fwd = np.full((n, rows, lmax), -1, dtype=np.int32)
    bwd = np.full((n, rows, lmax), -1, dtype=np.int32) if backward else None
    for l in range(1, lmax + 1):
        q1, q2 = block_hashes(H1, H2, *powers, l)
        ids = lookup(q1, q2).reshape(rows, n + 1 - l)
        del q1, q2
        if alive is not None:
            hit = ids >= 0
            v = ids[hit]
            v[~alive[v]] = -1
            ids[hit] = v
        fwd[l - 1 :, :, lmax - l] = ids.T
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


class Lattice:
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

    def __init__(
        self,
        strings: list[str],
        max_len: int,
        lookup,
        counts,
        *,
        exclude_full: bool = False,
        alive: np.ndarray | None = None,
        backward: bool = True,
        chunk_cells: int | None = None,
        threads: int = 2,
    ):
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
        powers = hash_powers(max_len)

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
                parts, 1, [(b, b) for b in range(span - 1, -1, -1)], "backward"
            )
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
            sizes = np.add.reduceat(kept[sl.lo : sl.hi], sl.gs, dtype=np.int32) if sl.hi > sl.lo else sl.sizes
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
                        xs = x[gs[g] : gs[g] + sizes[g]]
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
                post += np.repeat(beta[d] + log_weight[sl.r0 + g0 : sl.r0 + g1], sl.sizes[g0:g1])
                np.exp(post, out=post)
                return np.bincount(self.ep[lo:hi], weights=post, minlength=n_pieces)

            # jobs: runs of whole groups, about POSTERIOR_CHUNK edges each
            jobs = []
            for sl in self.f_slices:
                per = max(1, POSTERIOR_CHUNK * sl.sizes.size // max(1, sl.hi - sl.lo))
                jobs += [(sl, g, min(g + per, sl.sizes.size)) for g in range(0, sl.sizes.size, per)]
            expected = np.zeros(n_pieces)
            for c in pool.map(part, jobs) if pool is not None else map(part, jobs):
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
