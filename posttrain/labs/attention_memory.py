"""attention-memory: naive attention stores the N x N matrix (O(N^2) memory), FlashAttention only O(N).

Formula: naive S = scale Q K^T, P = softmax(S), O = P V materialise B*H*N^2 floats; FlashAttention's
online softmax keeps per query row only (m, l, o~): m' = max(m, rowmax S_j), l' = e^(m - m') l + rowsum
e^(S_j - m'), o~' = e^(m - m') o~ + e^(S_j - m') V_j, O = o~ / l, so its extra memory is the output plus
fixed tiles: O(N D). The one-pass recurrence (m, d) gives exactly the two-pass softmax.

Experiment: peak bytes allocated (``ops.memory.attention_peak_memory``: the profiler's allocator events)
of posttrain's ``naive_attention`` and ``flash_attention`` (forward and forward+backward) for growing N
(B = 1, H = 2, D = 64, fp32, causal). Checked: the exponent of the last doubling, log2(peak(2N)/peak(N)),
is 2 +- 0.15 for naive and <= 1.15 for flash (deterministic allocations; the tolerance covers the O(N)
terms beside the N^2 ones); ``online_softmax_2pass`` equals ``softmax`` and the tiled
``flash_attention_reference`` equals naive attention (float64, 1e-10). ``falsify`` measures naive
attention in flash's slot.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys

import torch

from posttrain.labs._common import pyplot
from posttrain.ops.flash import flash_attention
from posttrain.ops.flash_reference import flash_attention_reference
from posttrain.ops.memory import attention_peak_memory
from posttrain.ops.naive import naive_attention
from posttrain.ops.softmax import online_softmax_2pass, softmax

NAME = "attention-memory"
CLAIM = (
    "Naive attention's memory grows as O(N^2) (it stores the N x N scores), FlashAttention's as O(N) "
    "(online softmax over tiles); the online-softmax recurrence gives exactly the two-pass softmax."
)
FORMULA = "m' = max(m, x_j), d' = d e^(m - m') + e^(x_j - m');  peak_naive ~ B H N^2 * 4 bytes, peak_flash ~ B H N D"
NOTES = "notes 4 (Memory-efficient attention: online softmax -> FlashAttention): SRAM footprint independent of length"


@contextlib.contextmanager
def _quiet_stderr():
    """The CPU profiler's kineto backend prints start/stop lines on fd 2; hide them while measuring."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _peak(fn, q, k, v, backward: bool) -> int:
    with _quiet_stderr():
        return attention_peak_memory(fn, q, k, v, backward=backward, causal=True)


def run(ctx) -> None:
    g = torch.Generator().manual_seed(ctx.seed)
    ns = (256, 512, 1024) if ctx.quick else (256, 512, 1024, 2048, 4096)
    B, H, D = 1, 2, 64
    flash = naive_attention if ctx.falsify else flash_attention
    peaks = {"naive": [], "flash": [], "naive+bwd": [], "flash+bwd": []}
    for n in ns:
        q, k, v = (torch.randn(B, H, n, D, generator=g) for _ in range(3))
        for tag, fn in (("naive", naive_attention), ("flash", flash)):
            peaks[tag].append(_peak(fn, q, k, v, backward=False))
            peaks[tag + "+bwd"].append(_peak(fn, q, k, v, backward=True))
        ctx.say(
            f"  N={n:<5} naive {peaks['naive'][-1] / 2**20:8.2f} MiB  flash {peaks['flash'][-1] / 2**20:6.2f} MiB"
            f"   (+backward: {peaks['naive+bwd'][-1] / 2**20:8.2f} / {peaks['flash+bwd'][-1] / 2**20:6.2f} MiB)"
        )
    expo = {t: math.log2(p[-1] / p[-2]) for t, p in peaks.items()}
    for t in ("naive", "naive+bwd"):
        ctx.check(
            f"{t}: memory exponent at N={ns[-1]}",
            round(expo[t], 3),
            "2 +- 0.15",
            abs(expo[t] - 2) <= 0.15,
            "log2(peak(2N)/peak(N)); allocations are deterministic",
        )
    for t in ("flash", "flash+bwd"):
        ctx.check(
            f"{t}: memory exponent at N={ns[-1]}",
            round(expo[t], 3),
            "<= 1.15",
            expo[t] <= 1.15,
            "log2(peak(2N)/peak(N)); allocations are deterministic",
        )
    x = torch.randn(8, 257, generator=g, dtype=torch.float64) * 30
    online = torch.stack([online_softmax_2pass(row) for row in x])
    err_sm = (online - softmax(x)).abs().max().item()
    ctx.check(
        "online (1-pass max+sum) softmax == two-pass softmax",
        err_sm,
        "<= 1e-12",
        err_sm <= 1e-12,
        "float64, logits of scale 30",
    )
    q, k, v = (torch.randn(1, 2, 300, 32, generator=g, dtype=torch.float64) for _ in range(3))
    err_fa = (
        (
            flash_attention_reference(q, k, v, causal=True, block_q=64, block_k=48)[0]
            - naive_attention(q, k, v, causal=True)
        )
        .abs()
        .max()
        .item()
    )
    ctx.check(
        "tiled online-softmax attention == naive attention",
        err_fa,
        "<= 1e-10",
        err_fa <= 1e-10,
        "float64, N = 300 with 64 x 48 tiles",
    )
    ctx.numbers.update(
        {
            "N": list(ns),
            "B_H_D": [B, H, D],
            "peak_bytes": peaks,
            "exponent_last_doubling": expo,
            "n2_floats_bytes": [B * H * n * n * 4 for n in ns],
        }
    )

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for t, style in (("naive", "o-C3"), ("naive+bwd", "o--C3"), ("flash", "s-C0"), ("flash+bwd", "s--C0")):
        ax.plot(ns, [p / 2**20 for p in peaks[t]], style[:-2], color=style[-2:], label=f"{t} (slope {expo[t]:.2f})")
    ax.plot(ns, [B * H * n * n * 4 / 2**20 for n in ns], ":k", lw=1, label="B*H*N^2 fp32 (one score matrix)")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="sequence length N",
        ylabel="peak memory above inputs (MiB)",
        title=f"Attention peak memory, B={B} H={H} D={D} fp32, causal",
    )
    ax.minorticks_off()
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.legend(fontsize=8)
    ctx.figure(fig, "attention_memory")
