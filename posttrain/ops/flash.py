"""FlashAttention in PyTorch: tiled exact attention with O(N) extra memory, forward and backward.

Key insight: the online-softmax rescale applies to the output itself.  Per query row keep the
running max m, the denominator l and the UNnormalised output o~; a new key/value tile (K_j, V_j)
with logits S_j = scale * Q K_j^T updates them as

    m' = max(m, rowmax S_j)
    P~ = exp(S_j - m')                        alpha = exp(m - m')
    l' = alpha * l + rowsum P~                o~' = alpha * o~ + P~ V_j

and O = o~ / l at the end.  The N_q x N_k matrix is never stored; the forward keeps only O and the
per-row log-sum-exp L = m + log l (Dao et al. 2022, Alg. 1; Dao 2023, FlashAttention-2, Alg. 1).
That recurrence, written plainly, is :mod:`posttrain.ops.flash_reference`, this forward's test oracle.

The backward recomputes each tile from L: P = exp(S - L) exactly, then (Alg. 2)

    dV_j += P^T dO_i,   dP = dO_i V_j^T,   dS = P * (dP - D_i),
    dQ_i += scale * dS K_j,   dK_j += scale * dS^T Q_i,      D_i = rowsum(dO_i * O_i)

where D_i = <dP_i, P_i> is replaced by <dO_i, O_i> so P never has to be kept.

CPU-side economies, all exact.  On the CPU the products run at the BLAS's speed; what costs is
every full pass over a tile besides them (a max, an exp, a sum, a mask, a copy) and each torch call's
fixed cost.  So per forward tile we issue one bmm, one exp, one bmm-accumulate and one row sum:
  * the row shift rides inside the product through one augmented column,
    ``[scale Q, -m] [K, 1]^T = S - m``  (backward: ``[scale Q, -L] [K, 1]^T = S - L`` and
    ``[dO, -D] [V, 1]^T = dP - D``); ``[K_j, 1]`` is copied into one reused buffer whose ones column stays;
  * fixed shift per query block (fast path): softmax is exact for ANY finite shift, so each query
    block takes the row max of its FIRST tile as m and keeps it: no max pass, no rescale and no
    host sync on the later tiles.  Only overflow can break this (a later logit more than ~88 above
    m in float32); it is detected once per block (non-finite l or o~) and that block is redone by
    the lazy-rescale path, which moves a row's shift when a tile exceeds it by ``RESCALE_GAP``;
  * causal diagonal tiles are cut into ``DIAG_SPLIT`` narrower tiles, each computed only for the
    queries that see any of its keys (rows are query-major, so those are one contiguous range):
    3/4 of a diagonal tile's work instead of all of it; tiles hidden entirely are skipped;
  * scratch (tiles, [scale Q, -m], o~) is allocated once per call and reused by every tile; by
    default the forward spends its tile budget (BLOCK_Q queries of every head) on as few heads and
    as many queries as possible, processing chunks of heads in turn: taller products, fewer copies;
  * the backward takes its own, larger tiles when they are small next to dQ (``BWD_BLOCK_Q``), and
    accumulates dK/dV in a blocked (key block, B*Hkv, bk, D) layout so that each tile's update is
    one contiguous batched GEMM.

Layout: to batch many small products into one ``bmm`` we view q (B, H, Nq, D) as
(B*Hkv, bq*G, D) per query block, G = H / Hkv, rows ordered (query, head in group): the G query
heads that share a K/V head become extra rows of one matrix, so grouped-query attention costs no
K/V copies and dK/dV sum over the group for free.  Tiles are large (hundreds of rows) because on
the CPU each torch op has a fixed cost; the loops in Python run over blocks, never over rows.

Conventions are ``dispatch.sdpa_attention``'s: causal aligned to the end (query i sees keys
j <= i + Nk - Nq), ``key_padding_mask`` (B, Nk) True = real key, rows with no visible key give
zeros and zero gradients.  bfloat16/float16 inputs are computed in float32 (output cast back),
float64 stays float64.  Tiles that the causal mask hides entirely are skipped.

Not handled: dropout, attention bias beyond the masks, and double backward.
"""

from __future__ import annotations

import math

import torch

from posttrain.ops.naive import check_attention_inputs

BLOCK_Q = 256
"""Forward: query rows per tile.  256 x 256 keeps the extra memory near SDPA's (a tile of B*H*256*256 floats);
larger tiles are a little faster on the CPU but cost memory (see docs/attention.md)."""
BLOCK_K = 256
"""Forward: key rows per tile."""
BWD_BLOCK_Q = 512
"""Backward: query rows per tile when its two tiles (P and dS, 2 * B*H*512*512 floats) are no larger
than dQ (B*H*Nq*D floats), i.e. from N = 8k at D = 64; else BLOCK_Q.  The backward holds dQ, dK and
dV anyway, so then its peak stays near SDPA's, and fewer, larger products are ~10% faster."""
BWD_BLOCK_K = 512
"""Backward: key rows per tile, under the same condition (else BLOCK_K)."""
DIAG_SPLIT = 2
"""A causal tile on the diagonal is cut into this many narrower tiles, each computed only for the
queries that see its keys: (1 + 1/DIAG_SPLIT) / 2 of the tile's work instead of all of it (3/4; more
cuts save more work but make skinnier products, which measured no faster)."""
RESCALE_GAP = 8.0
"""Rescaling path (the fallback): a row keeps its shift until a tile's logits exceed it by this much (e^8 ~ 3e3)."""


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _Plan:
    """Which key tiles each query block visits, from which row on, and how they must be masked.

    Rows of a query block are ordered query-major, row = r * G + head-in-group, so the rows of the
    queries from r0 on are one contiguous range.  A causal tile on the diagonal is cut into
    ``DIAG_SPLIT`` narrower tiles, each computed only for the queries that see any of its keys.
    """

    def __init__(self, nq, nk, causal, kpm, block_q, block_k, device, g):
        self.nq, self.nk, self.causal, self.kpm, self.g = nq, nk, causal, kpm, g
        self._cmasks: dict[tuple[int, int, int], torch.Tensor] = {}
        self._pmasks: dict[tuple[int, int], torch.Tensor] = {}
        self.block_q, self.block_k, self.device = block_q, block_k, device
        self.offset = nk - nq  # query i sees keys j <= i + offset
        starts = range(0, nk, block_k)
        if kpm is None:
            self.kpm_state = ["all"] * len(starts)
        else:  # per key block: "none" real -> skip, "all" real -> no mask, else "some"
            counts = torch.stack([kpm[:, j0 : j0 + block_k].sum() for j0 in starts]).tolist() if len(starts) else []
            sizes = [kpm.shape[0] * min(block_k, nk - j0) for j0 in starts]
            self.kpm_state = ["none" if c == 0 else "all" if c == s else "some" for c, s in zip(counts, sizes)]

    def _causal_tile(self, shift: int, nr: int, bk: int) -> torch.Tensor:
        """(nr*G, bk) True = hidden: key j0+c is hidden from query i0+r iff c - r > -shift; cached by shape.
        Only the first rows of a tile have hidden keys, so nr is that count, not the tile's."""
        key = (shift, nr, bk)
        if key not in self._cmasks:
            r = torch.arange(nr, device=self.device)[:, None]
            c = torch.arange(bk, device=self.device)[None, :]
            self._cmasks[key] = (c + shift > r).repeat_interleave(self.g, dim=0)
        return self._cmasks[key]

    def _padding(self, j0: int, j1: int) -> torch.Tensor:
        key = (j0, j1)
        if key not in self._pmasks:
            self._pmasks[key] = ~self.kpm[:, None, j0:j1]  # (B*Hkv, 1, bk) True = hidden
        return self._pmasks[key]

    def key_blocks(self, i0: int, i1: int) -> list[tuple]:
        """[(j0, j1, r0, causal_mask or None, padding_mask or None)] for queries [i0, i1): keys [j0, j1)
        against the queries from i0 + r0 on (earlier ones see none of these keys)."""
        last = self.nk if not self.causal else min(self.nk, i1 - 1 + self.offset + 1)
        tiles = []
        for jb, j0 in enumerate(range(0, max(last, 0), self.block_k)):
            if self.kpm_state[jb] == "none":
                continue
            j1 = min(j0 + self.block_k, last)  # a causal block ends where the last query's keys end
            if self.causal and j1 - 1 > i0 + self.offset:  # some (i, j) in the tile is hidden: cut it
                width = max(1, self.block_k // DIAG_SPLIT)
                parts = [(c0, min(c0 + width, j1)) for c0 in range(j0, j1, width)]
            else:
                parts = [(j0, j1)]
            for c0, c1 in parts:
                r0 = max(0, c0 - self.offset - i0) if self.causal else 0  # the first query that sees key c0
                cmask = None
                if self.causal and c1 - 1 > i0 + r0 + self.offset:  # only the first rows have hidden keys
                    masked = min(i1 - i0 - r0, c1 - 1 - i0 - r0 - self.offset)
                    cmask = self._causal_tile(c0 - i0 - r0 - self.offset, masked, c1 - c0)
                pmask = None if self.kpm_state[jb] == "all" else self._padding(c0, c1)
                tiles.append((c0, c1, r0, cmask, pmask))
        return tiles


def _mask_tile(s: torch.Tensor, cmask, pmask) -> None:
    """In place: s (B*Hkv, rows, bk) gets -inf where the causal or padding mask hides a key."""
    if cmask is not None:
        s[:, : cmask.shape[0]].masked_fill_(cmask, float("-inf"))  # (first rows, bk) broadcast over batch*heads
    if pmask is not None:
        s.masked_fill_(pmask, float("-inf"))  # (B*Hkv, 1, bk) broadcast over the rows


class _Scratch:
    """Flat scratch buffers, allocated once per call; ``view(name, *shape)`` is a contiguous view of the front."""

    def __init__(self, dtype, device, **sizes):
        self.dtype, self.device, self.sizes, self.bufs = dtype, device, sizes, {}
        self.views: dict[tuple, torch.Tensor] = {}

    def view(self, name: str, *shape: int) -> torch.Tensor:
        key = (name, *shape)
        t = self.views.get(key)
        if t is None:
            n = math.prod(shape)
            buf = self.bufs.get(name)
            if buf is None or buf.numel() < n:
                buf = self.bufs[name] = torch.empty(
                    max(n, self.sizes.get(name, 0)), dtype=self.dtype, device=self.device
                )
                self.views = {k: v for k, v in self.views.items() if k[0] != name}
            t = self.views[key] = buf[:n].view(shape)
        return t


class _KeyTiles:
    """Augmented key tiles [K_j, 1] (B*Hkv, bk, D+1) in one reused buffer; the ones column is rewritten only
    when the tile width changes.  Returns (ka, ka^T, ka[..., :D]) views, cached per width."""

    def __init__(self, kf: torch.Tensor, dtype: torch.dtype, block: int):
        self.kf, self.n, self.d = kf, kf.shape[0], kf.shape[-1]
        self.flat = torch.empty(self.n * min(block, kf.shape[1]) * (self.d + 1), dtype=dtype, device=kf.device)
        self.views: dict[int, tuple] = {}
        self.src: dict[tuple[int, int], torch.Tensor] = {}  # (j0, j1) -> kf[:, j0:j1]
        self.ones_width = -1  # the tile width whose ones column is in place

    def rebind(self, kf: torch.Tensor) -> None:
        """Take key rows from another (at most as wide) chunk of heads; the buffer is reused."""
        if kf.shape[0] != self.n:
            self.flat = self.flat[: kf.shape[0] * (self.flat.numel() // self.n)]
            self.n, self.views, self.ones_width = kf.shape[0], {}, -1
        self.kf, self.src = kf, {}

    def __call__(self, j0: int, j1: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        bk = j1 - j0
        views = self.views.get(bk)
        if views is None:
            ka = self.flat[: self.n * bk * (self.d + 1)].view(self.n, bk, self.d + 1)
            views = self.views[bk] = (ka, ka.transpose(1, 2), ka[..., : self.d])
        if self.ones_width != bk:
            views[0][..., self.d] = 1.0
            self.ones_width = bk
        rows = self.src.get((j0, j1))
        if rows is None:
            rows = self.src[(j0, j1)] = self.kf[:, j0:j1]
        views[2].copy_(rows)
        return views


class _Rows:
    """Cached row-block views t[:, j0:j1] of a (B*Hkv, N, D) tensor (the same blocks recur for every query block)."""

    def __init__(self, t: torch.Tensor):
        self.t, self.cache = t, {}

    def __call__(self, j0: int, j1: int) -> torch.Tensor:
        r = self.cache.get((j0, j1))
        if r is None:
            r = self.cache[(j0, j1)] = self.t[:, j0:j1]
        return r


def _flash_forward(q, k, v, causal, kpm, scale, block_q, block_k, head_chunk=None):
    """Forward over chunks of ``head_chunk`` (batch, K/V head) pairs at a time (default: all of them)."""
    b, h, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    g, bh = h // hkv, b * hkv
    dt, dev = _acc_dtype(q.dtype), q.device
    kpm = None if kpm is None else kpm.repeat_interleave(hkv, dim=0)  # (B*Hkv, Nk)
    qg = q.view(bh, g, nq, d)  # (B*Hkv, G, Nq, D): query heads grouped by their K/V head
    kf = k.view(bh, nk, d).to(dt)  # (B*Hkv, Nk, D); a copy only for bf16/fp16 inputs
    vf = v.view(bh, nk, d).to(dt)
    out = torch.empty_like(q)  # (B, H, Nq, D)
    outg = out.view(bh, g, nq, d)
    lse = torch.empty(bh, g, nq, dtype=dt, device=dev)  # (B*Hkv, G, Nq)
    hc = min(head_chunk or bh, bh)
    # scratch reused by every chunk, block and tile: the only memory besides O and L
    rows = hc * g * min(block_q, nq)
    scratch = _Scratch(dt, dev, s=rows * min(block_k, nk), qa=rows * (d + 1), acc=rows * d)
    key_tile = _KeyTiles(kf[:hc], dt, block_k)
    for h0 in range(0, bh, hc):
        h1 = min(h0 + hc, bh)
        if h0:
            key_tile.rebind(kf[h0:h1])
        plan = _Plan(nq, nk, causal, None if kpm is None else kpm[h0:h1], block_q, block_k, dev, g)
        _forward_chunk(qg[h0:h1], outg[h0:h1], lse[h0:h1], plan, key_tile, _Rows(vf[h0:h1]), scratch, scale, block_q)
    return out, lse


def _forward_chunk(qg, outg, lse, plan, key_tile, v_rows, scratch, scale, block_q):
    bh, g, nq, d = qg.shape
    for i0 in range(0, nq, block_q):
        i1 = min(i0 + block_q, nq)
        bq, gbq = i1 - i0, g * (i1 - i0)
        tiles = plan.key_blocks(i0, i1)
        # qa = [scale Q_i, -m]: with ka = [K_j, 1] one bmm gives S - m, the shifted logits.  Rows query-major.
        qa = scratch.view("qa", bh, gbq, d + 1)
        torch.mul(qg[:, :, i0:i1].transpose(1, 2), scale, out=qa[..., :d].view(bh, bq, g, d))
        qa[..., d] = 0.0
        acc = scratch.view("acc", bh, gbq, d)  # o~ = sum P~ V
        res = _forward_block_fast(qa, acc, tiles, key_tile, v_rows, scratch, g) if tiles else None
        if res is None:
            res = _forward_block_safe(qa, acc, tiles, key_tile, v_rows, scratch, g)
        m, l = res
        empty = l == 0  # rows with no visible key
        acc.div_(l.masked_fill(empty, 1.0)[..., None])  # O = o~ / l; empty rows stay 0
        outg[:, :, i0:i1] = acc.view(bh, bq, g, d).transpose(1, 2)
        # empty rows: L = +inf so that the backward's exp(S - L) is exactly 0
        lse[:, :, i0:i1] = (m + torch.log(l)).masked_fill(empty, float("inf")).view(bh, bq, g).transpose(1, 2)


def _forward_block_fast(qa, acc, tiles, key_tile, v_rows, scratch, g):
    """One query block with the shift m fixed to the first tile's row max: no max pass after that tile.

    Exact for any shift; returns None (caller falls back to ``_forward_block_safe``) when a row sees
    no key in the first tile or when exp(S - m) overflowed somewhere (a later tile far above m).
    """
    bh, gbq, d = acc.shape
    if tiles[0][2] != 0:  # the first tile does not cover every query
        return None
    lsums = scratch.view("lsum", len(tiles), bh, gbq)  # rowsum P~ per tile, summed once at the end
    if any(r0 for _, _, r0, _, _ in tiles):
        lsums.zero_()
    for t, (j0, j1, r0, cmask, pmask) in enumerate(tiles):
        s = scratch.view("s", bh, gbq - r0 * g, j1 - j0)
        qa_t = qa if r0 == 0 else qa[:, r0 * g :]  # the queries that see any of these keys
        torch.bmm(qa_t, key_tile(j0, j1)[1], out=s)  # (B*Hkv, rows, bk) = S - m
        _mask_tile(s, cmask, pmask)
        if t == 0:
            m = s.amax(dim=-1)  # (B*Hkv, G*bq): the shift for the whole block
            if float(m.min()) == float("-inf"):  # a row with no visible key here: its shift must wait
                return None
            s.sub_(m[..., None])
            qa[..., d] = -m
        s.exp_()  # P~ = exp(S - m), hidden keys -> 0
        if t == 0:
            torch.bmm(s, v_rows(j0, j1), out=acc)  # o~ = P~ V_j
        else:
            (acc if r0 == 0 else acc[:, r0 * g :]).baddbmm_(s, v_rows(j0, j1))  # o~ += P~ V_j
        torch.sum(s, dim=-1, out=lsums[t] if r0 == 0 else lsums[t, :, r0 * g :])
    l = lsums.sum(dim=0)
    if not math.isfinite(float(l.sum() + acc.sum())):  # overflow (or inf/nan inputs): redo with rescaling
        return None
    return m, l


def _forward_block_safe(qa, acc, tiles, key_tile, v_rows, scratch, g):
    """One query block with the lazy rescale: the shift moves when a tile exceeds it by RESCALE_GAP."""
    bh, gbq, d = acc.shape
    m = torch.zeros((bh, gbq), dtype=acc.dtype, device=acc.device)  # the shift in use (finite)
    l = torch.zeros((bh, gbq), dtype=acc.dtype, device=acc.device)  # running denominator sum P~
    qa[..., d] = 0.0  # the fast path may have set a shift
    acc.zero_()
    all_seen = False  # every row has seen a visible key (then its shift is a real max)
    for j0, j1, r0, cmask, pmask in tiles:
        rows = slice(r0 * g, None)  # the queries that see any of these keys
        qa_t, acc_t, m_t, l_t = qa[:, rows], acc[:, rows], m[:, rows], l[:, rows]
        s = scratch.view("s", bh, gbq - r0 * g, j1 - j0)
        torch.bmm(qa_t, key_tile(j0, j1)[1], out=s)  # (B*Hkv, rows, bk) = S - m
        _mask_tile(s, cmask, pmask)
        rowmax = s.amax(dim=-1)  # (B*Hkv, rows), relative to the shift m
        # Keep the old shift unless the tile exceeds it by more than RESCALE_GAP (exp stays <= e^8,
        # no overflow) or the row has no shift yet.  Any shift is exact.
        jump = rowmax > RESCALE_GAP
        if not all_seen:
            jump |= (l_t == 0) & (rowmax > float("-inf"))  # fresh rows take the tile max as their shift
        if bool(jump.any()):
            delta = torch.where(jump, rowmax, 0.0)  # (B*Hkv, rows) new shift m' = m + delta
            s.sub_(delta[..., None])
            m_t.add_(delta)
            qa_t[..., d] = -m_t
            alpha = torch.exp(-delta).clamp_(max=1.0)  # exp(m - m'); rows with no shift yet hold zeros
            acc_t.mul_(alpha[..., None])
            l_t.mul_(alpha)
        s.exp_()  # P~ = exp(S - m'), hidden keys -> 0
        acc_t.baddbmm_(s, v_rows(j0, j1))  # o~ += P~ V_j
        l_t.add_(s.sum(dim=-1))  # l += rowsum P~
        if not all_seen:
            all_seen = bool((l > 0).all())
    return m, l


def _backward_tiles(qg, og, dog, lse, plan, key_tile, value_tile, dq, dk_blk, dv_blk, scale, block_q, block_k, b):
    """The backward's loop over query blocks and their key tiles; its scratch is freed when it returns."""
    bh, g, nq, d = qg.shape
    dt, dev = dk_blk.dtype, dk_blk.device
    bk_full = dk_blk.shape[2]
    big = torch.finfo(dt).max / 4  # stands in for L = +inf of empty rows: exp(S - big) = 0, no inf arithmetic
    rows = bh * g * min(block_q, nq)
    scratch = _Scratch(dt, dev, p=rows * bk_full, ds=rows * bk_full, qa=rows * (d + 1), doa=rows * (d + 1), dq=rows * d)
    for i0 in range(0, nq, block_q):
        i1 = min(i0 + block_q, nq)
        bq, gbq = i1 - i0, g * (i1 - i0)
        # augmented columns fold the row shifts into the products: [sQ, -L][K, 1]^T = S - L, [dO, -D][V, 1]^T = dP - D
        qa = scratch.view("qa", bh, gbq, d + 1)  # (B*Hkv, G*bq, D+1), rows query-major
        doa = scratch.view("doa", bh, gbq, d + 1)
        torch.mul(qg[:, :, i0:i1].transpose(1, 2), scale, out=qa[..., :d].view(bh, bq, g, d))
        doa[..., :d].view(bh, bq, g, d).copy_(dog[:, :, i0:i1].transpose(1, 2))
        ob = og[:, :, i0:i1].transpose(1, 2)  # (B*Hkv, bq, G, D)
        torch.sum(
            doa[..., :d].view(bh, bq, g, d) * ob, dim=-1, out=doa[..., d].view(bh, bq, g)
        ).neg_()  # -D_i = -rowsum(dO * O)
        torch.clamp(lse[:, :, i0:i1].transpose(1, 2), max=big, out=qa[..., d].view(bh, bq, g)).neg_()  # -L_i
        dqb = scratch.view("dq", bh, gbq, d).zero_()
        for j0, j1, r0, cmask, pmask in plan.key_blocks(i0, i1):
            sl = slice(r0 * g, None)  # the queries that see any of these keys
            qa_t, doa_t = qa[:, sl], doa[:, sl]
            ka, kat, krows = key_tile(j0, j1)  # [K_j, 1] (B*Hkv, bk, D+1), its transpose, K_j
            va, vat, _ = value_tile(j0, j1)
            jb, c0 = divmod(j0, block_k)
            dk_j, dv_j = (t[jb, :, c0 : c0 + j1 - j0] for t in (dk_blk, dv_blk))  # (B*Hkv, bk, D)
            p = scratch.view("p", bh, gbq - r0 * g, j1 - j0)
            torch.bmm(qa_t, kat, out=p)  # (B*Hkv, rows, bk) = S - L
            _mask_tile(p, cmask, pmask)
            p.exp_()  # P = exp(S - L), recomputed
            dv_j.baddbmm_(p.transpose(1, 2), doa_t[..., :d])  # dV_j += P^T dO
            ds = scratch.view("ds", bh, gbq - r0 * g, j1 - j0)
            torch.bmm(doa_t, vat, out=ds).mul_(p)  # dS = P * (dO V^T - D)
            (dqb if r0 == 0 else dqb[:, sl]).baddbmm_(ds, krows)  # dQ_i += dS K_j   (times scale below)
            dk_j.baddbmm_(ds.transpose(1, 2), qa_t[..., :d])  # dK_j += dS^T (scale Q_i)
        dq[:, :, i0:i1] = dqb.mul_(scale).view(bh, bq, g, d).transpose(1, 2)


def _flash_backward(grad_out, q, k, v, out, lse, causal, kpm, scale, block_q, block_k):
    b, h, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    g, bh = h // hkv, b * hkv
    dt, dev = _acc_dtype(q.dtype), q.device
    kpm = None if kpm is None else kpm.repeat_interleave(hkv, dim=0)  # (B*Hkv, Nk)
    plan = _Plan(nq, nk, causal, kpm, block_q, block_k, dev, g)
    qg = q.view(bh, g, nq, d)
    og = out.view(bh, g, nq, d)
    dog = grad_out.view(bh, g, nq, d)
    key_tile = _KeyTiles(k.view(bh, nk, d), dt, block_k)  # [K_j, 1]
    value_tile = _KeyTiles(v.view(bh, nk, d), dt, block_k)  # [V_j, 1]
    dq = torch.empty(bh, g, nq, d, dtype=q.dtype, device=dev)  # (B*Hkv, G, Nq, D)
    # dK, dV in a blocked layout (key block, B*Hkv, bk, D): each tile's slice is one contiguous matrix
    # batch, which lets the batched GEMM accumulate into it directly (a strided slice is done per head)
    nkb, bk_full = -(-nk // block_k), min(block_k, nk)
    dk_blk = torch.zeros(nkb, bh, bk_full, d, dtype=dt, device=dev)
    dv_blk = torch.zeros_like(dk_blk)
    _backward_tiles(qg, og, dog, lse, plan, key_tile, value_tile, dq, dk_blk, dv_blk, scale, block_q, block_k, b)

    def unblock(t_blk, dtype):  # (key block, B*Hkv, bk, D) -> (B, Hkv, Nk, D)
        t = torch.empty(b, hkv, nk, d, dtype=dtype, device=dev)
        t.view(bh, nk, d)[:, : (nk // bk_full) * bk_full].view(bh, nk // bk_full, bk_full, d).copy_(
            t_blk[: nk // bk_full].transpose(0, 1)
        )
        if nk % bk_full:
            t.view(bh, nk, d)[:, (nk // bk_full) * bk_full :] = t_blk[-1, :, : nk % bk_full]
        return t

    dk = unblock(dk_blk, k.dtype)
    del dk_blk
    dv = unblock(dv_blk, v.dtype)
    return dq.view(b, h, nq, d), dk, dv


class FlashAttention(torch.autograd.Function):
    """Tiled attention; saves q, k, v, O and the per-row log-sum-exp (no N x N tensor)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, key_padding_mask, scale, fwd_blocks, bwd_blocks):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        kpm = None if key_padding_mask is None else key_padding_mask.to(torch.bool)
        out, lse = _flash_forward(q, k, v, causal, kpm, scale, *fwd_blocks)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.kpm, ctx.causal, ctx.scale, ctx.blocks = kpm, causal, scale, bwd_blocks
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _flash_backward(
            grad_out.contiguous(), q, k, v, out, lse, ctx.causal, ctx.kpm, ctx.scale, *ctx.blocks
        )
        return dq, dk, dv, None, None, None, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
    scale: float | None = None,
    *,
    block_q: int | None = None,
    block_k: int | None = None,
) -> torch.Tensor:
    """Exact attention softmax(scale Q K^T + mask) V, tiled.  q (B, H, Nq, D), k/v (B, Hkv, Nk, D) -> (B, H, Nq, D).

    The arguments, their order and defaults are :func:`posttrain.ops.attention`'s (causal by default;
    scale defaults to 1/sqrt(D)): end-aligned causality for Nq != Nk, a (B, Nk) key-padding mask (True =
    real key) and grouped-query attention; only the tile sizes are extra.
    """
    check_attention_inputs(q, k, v, key_padding_mask)
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        raise ValueError(f"q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if (block_q is not None and block_q < 1) or (block_k is not None and block_k < 1):
        raise ValueError(f"block sizes must be positive, got block_q={block_q}, block_k={block_k}")
    # an explicit block size applies to both passes; otherwise each pass takes its own default
    fwd_blocks = (int(block_q or BLOCK_Q), int(block_k or BLOCK_K))
    if block_q is None and block_k is None:
        # the default tile's memory (BLOCK_Q queries of every head) spent on as few heads and as many
        # queries as possible: taller products and fewer [K, 1] copies, the same peak memory.  Causal
        # blocks stay at <= Nq/16 queries: more heads per product, a smaller cut diagonal (A/B: -3% time on
        # one thread, -10 to -16% on two, at N = 4k/8k).  With several threads a causal product spans all
        # the heads of the budget (BLOCK_Q queries each): a batched product splits across threads better
        # than one tall one (A/B on two threads, H = 4: -4% at 8k, -10% at 16k; one thread keeps Nq/16,
        # which is 12% faster there at 16k).
        bh, budget = k.shape[0] * k.shape[1], BLOCK_Q * k.shape[0] * k.shape[1]
        tall = min(q.shape[-2], budget)
        if causal:
            tall = min(tall, BLOCK_Q if torch.get_num_threads() > 1 else max(BLOCK_Q, q.shape[-2] // 16))
        fwd_blocks = (tall, BLOCK_K, max(1, min(bh, budget // tall)))
    large = 2 * BWD_BLOCK_Q * BWD_BLOCK_K <= q.shape[-2] * q.shape[-1]  # the two backward tiles <= dQ
    bwd_blocks = (
        int(block_q or (BWD_BLOCK_Q if large else BLOCK_Q)),
        int(block_k or (BWD_BLOCK_K if large else BLOCK_K)),
    )
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return FlashAttention.apply(q, k, v, bool(causal), key_padding_mask, scale, fwd_blocks, bwd_blocks)


def flash_attention_backend(q, k, v, causal: bool = True, key_padding_mask=None, scale: float | None = None):
    """Backend "flash" for ``posttrain.ops.attention`` (the dispatch signature)."""
    return flash_attention(q, k, v, causal, key_padding_mask, scale)
