"""Attention benchmark: naive vs PyTorch SDPA vs ours (tiled PyTorch flash; Triton on CUDA), side by side.

    .venv/bin/python benchmarks/bench_attention.py                 # N in 1k,4k,8k,16k (~10 min on 2 busy cores)
    .venv/bin/python benchmarks/bench_attention.py --sizes 1k,4k   # a subset
    .venv/bin/python benchmarks/bench_attention.py --device cuda   # adds the Triton kernel
    .venv/bin/python benchmarks/bench_attention.py --threads 1 --clock cpu   # on a shared machine (see docs)

B=1, H=4, D=64, float32 (bf16 on CUDA), causal and not, forward and forward+backward.  Time = median
over --repeats runs, the implementations interleaved within each repeat so that noise from a shared
machine hits them alike.  ``--clock cpu`` times with the process's CPU clock instead of the wall
clock: on a shared machine it leaves out the time the process waits descheduled (with --threads 1 it is
the compute time itself; with more threads it sums the threads' times, so use the wall clock there).  Peak memory = bytes allocated during the call above what was live before it
(inputs excluded; output and gradients included), from ``posttrain.ops.memory``.  Naive attention is
skipped where its N x N matrices would exceed --naive-max-gb.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from posttrain.ops import ATTENTION_BACKENDS
from posttrain.ops.memory import attention_peak_memory


def parse_size(text: str) -> int:
    text = text.strip().lower()
    return int(float(text[:-1]) * 1024) if text.endswith("k") else int(text)


def naive_bytes(n: int, h: int, backward: bool) -> float:
    """Rough peak of the naive path: ~4 live (H, N, N) float32 matrices forward, ~6 with backward."""
    return (6 if backward else 4) * h * n * n * 4


def run_once(fn, q, k, v, go, causal: bool, backward: bool, sync, clock=time.perf_counter) -> float:
    t0 = clock()
    out = fn(q, k, v, causal=causal)
    if backward:
        torch.autograd.grad(out, (q, k, v), go)
    sync()
    return clock() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1k,4k,8k,16k", help="comma-separated sequence lengths, e.g. 1k,4k or 1000")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per cell (median reported)")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--naive-max-gb", type=float, default=6.0, help="skip naive where its estimate exceeds this")
    ap.add_argument("--causal", default="both", choices=["both", "yes", "no"])
    ap.add_argument(
        "--threads", type=int, default=0, help="torch threads for every implementation (0 = torch's default)"
    )
    ap.add_argument(
        "--clock",
        default="wall",
        choices=["wall", "cpu"],
        help="wall clock, or this process's CPU time (shared machines, --threads 1)",
    )
    ap.add_argument("--no-memory", action="store_true", help="skip the (slow, profiler-based) memory measurement")
    args = ap.parse_args(argv)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.clock == "cpu" and args.device == "cuda":
        print("error: --clock cpu times the host, not the GPU; use --clock wall with --device cuda", file=sys.stderr)
        return 2
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is visible", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    ours = "triton" if device.type == "cuda" else "flash"
    impls = ["naive", "sdpa", "flash"] + (["triton"] if device.type == "cuda" else [])
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    h, d = args.heads, args.head_dim

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"# attention benchmark: B=1 H={h} D={d} {str(dtype).replace('torch.', '')} on {device.type}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.clock} clock, median of {args.repeats}, load avg {load:.1f}"
    )
    print("# time in ms; mem = peak MiB allocated during the call above the inputs; '-' = skipped (would not fit)")
    cols = (
        [f"{i} ms" for i in impls]
        + [f"{ours}/sdpa t"]
        + [f"{i} MiB" for i in impls]
        + [f"{ours}/sdpa mem", f"naive/{ours} mem"]
    )
    header = f"{'N':>6} {'causal':>6} {'pass':>7} " + " ".join(f"{c:>14}" for c in cols)
    print(header)
    print("-" * len(header))
    for n in sizes:
        gen = torch.Generator(device=device).manual_seed(0)
        q, k, v, go = (torch.randn(1, h, n, d, generator=gen, device=device).to(dtype) for _ in range(4))
        for causal in causals:
            for backward in (False, True):
                active = [
                    i for i in impls if not (i == "naive" and naive_bytes(n, h, backward) > args.naive_max_gb * 2**30)
                ]
                qq, kk, vv = (t.detach().requires_grad_(backward) for t in (q, k, v))
                times = {i: [] for i in active}
                for i in active:  # warm-up (also compiles Triton)
                    run_once(ATTENTION_BACKENDS[i], qq, kk, vv, go, causal, backward, sync)
                for _ in range(args.repeats):
                    for i in active:
                        times[i].append(run_once(ATTENTION_BACKENDS[i], qq, kk, vv, go, causal, backward, sync, clock))
                med = {i: statistics.median(ts) * 1e3 for i, ts in times.items()}
                mem = {}
                if not args.no_memory:
                    for i in active:
                        mem[i] = (
                            attention_peak_memory(ATTENTION_BACKENDS[i], q, k, v, backward=backward, causal=causal)
                            / 2**20
                        )

                def fmt(x, spec=".1f"):
                    return "-" if x is None else format(x, spec)

                row = [fmt(med.get(i)) for i in impls]
                row.append(fmt(med[ours] / med["sdpa"], ".2f"))
                row += [fmt(mem.get(i)) for i in impls]
                row.append(fmt(mem[ours] / mem["sdpa"], ".2f") if mem else "-")
                row.append(fmt(mem["naive"] / mem[ours], ".0f") if "naive" in mem else "-")
                print(
                    f"{n:>6} {str(causal):>6} {'fwd+bwd' if backward else 'fwd':>7} "
                    + " ".join(f"{c:>14}" for c in row),
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
