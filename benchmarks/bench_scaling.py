"""Scale-out on this machine: SFT throughput on 1 vs 2 processes (DDP, gloo), and peak RSS per process of
FSDP2 against DDP for a model of a few tens of millions of parameters (SFT, the reward model, PPO).

    .venv/bin/python benchmarks/bench_scaling.py                # both tables
    .venv/bin/python benchmarks/bench_scaling.py --only memory --trainers rm ppo

Every configuration runs `torchrun --standalone --nproc-per-node N` on this script's worker mode, which calls
`posttrain.trainers.sft.train_sft` (the same code as `torchrun -m posttrain sft`) and records, per rank, the
median step time of the steps after warm-up and the process's peak RSS (``ru_maxrss``). Throughput is the
global batch's tokens per second of step time. Expect modest gains from 2 processes on 2 cores: the gloo
all-reduce of every gradient is a memory copy on one machine, and both processes share the same cores and
memory bandwidth that 1 process with 2 threads would use.

Peak RSS includes, on every rank, the full model built before it is sharded (initialisation on the meta
device is not implemented), and on rank 0 the whole model gathered at the end to write ``model/``: FSDP's
saving shows as the difference in gradients and Adam state, not as a halving of the process. The workers
run with ``MALLOC_MMAP_THRESHOLD_=131072``: with glibc's default (dynamic) threshold the freed all-gather and
reduce-scatter buffers of FSDP stay in the heap, and the peak RSS hid most of FSDP's saving (measured: an RM
rank's peak 944 MB under FSDP against 1000 MB under DDP by default, 641 against 974 with the fixed threshold). PPO holds a
policy and a critic (each with gradients and Adam state) and a frozen reference: DDP keeps all three whole on
every rank; FSDP2 shards the policy and the critic, keeps the reference whole, and adds the rollout replica (one
more whole copy of the policy's weights).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _gpt(args):
    from posttrain.models.gpt import GPTConfig

    return GPTConfig(n_layer=args.layers, n_head=args.heads, d_model=args.width, max_seq_len=32)


def _other_trainer(args, out: Path) -> None:
    """The reward model (synthetic pairs, a fresh backbone) or PPO (from ``--init``) on the ``--layers x --width``
    GPT, a few steps: for their peak RSS."""
    from posttrain.data.preference_pairs import PairDataConfig
    from posttrain.tasks.arithmetic import ArithmeticConfig

    task, common = ArithmeticConfig(num_demos=64, num_eval=4), dict(eval_every=0, save_every=0, progress=False)
    if args.trainer == "rm":
        from posttrain.trainers.reward import RMConfig, train_reward_model

        pairs = PairDataConfig(num_prompts=64)
        train_reward_model(
            RMConfig(out=str(out / "run"), steps=args.steps, batch_size=args.batch_size, warmup_steps=1,
                     model=_gpt(args), task=task, pairs=pairs, eval_prompts=8, stats_pairs=8, fsdp=args.fsdp, **common)
        )  # fmt: skip
    else:
        from posttrain.trainers.ppo import PPOConfig, train_ppo

        train_ppo(
            PPOConfig(out=str(out / "run"), init=args.init, steps=args.steps, prompts_per_step=2, num_generations=2,
                      max_new_tokens=4, warmup_steps=0, task=task, fsdp=args.fsdp, **common)
        )  # fmt: skip


def worker(args) -> None:
    from posttrain.tasks.arithmetic import ArithmeticConfig
    from posttrain.trainers.distributed import world
    from posttrain.trainers.sft import SFTConfig, train_sft

    w = world()
    out = Path(args.out)
    if args.trainer != "sft":
        _other_trainer(args, out)
        rec = {"rank": w.rank, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        (out / f"rank{w.rank}.json").write_text(json.dumps(rec))
        return
    cfg = SFTConfig(
        out=str(out / "run"),
        steps=args.steps,
        batch_size=args.batch_size,
        eval_every=0,
        save_every=0,
        progress=False,
        warmup_steps=1,
        max_new_tokens=4,
        threads=args.threads,
        fsdp=args.fsdp,
        model=_gpt(args),
        task=ArithmeticConfig(num_demos=256, num_eval=4),
    )
    train_sft(cfg)
    steps = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    step_times = [r["step_time"] for r in steps[2:]] or [r["step_time"] for r in steps]
    tokens = [r["tokens_per_s"] * r["step_time"] for r in steps]  # the global batch's real tokens
    rec = {
        "rank": w.rank,
        "world": w.world_size,
        "median_step_s": statistics.median(step_times),
        "tokens_per_step": statistics.median(tokens),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    (out / f"rank{w.rank}.json").write_text(json.dumps(rec))


def launch(nproc: int, extra: list[str], keep: Path | None = None) -> list[dict]:
    """Run the worker under torchrun (in a temporary directory, or in ``keep``); each rank's record."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = str(keep or tmp)
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            str(Path(__file__).resolve()),
            "--worker",
            "--out",
            tmp,
            *extra,
        ]
        # a fixed mmap threshold: glibc's dynamic one (raised to the size of every large block freed) keeps freed
        # tensors of a few MB in the heap, and the peak RSS then shows the allocator's high-water mark, not the tensors
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"torchrun failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        return [json.loads((Path(tmp) / f"rank{i}.json").read_text()) for i in range(nproc)]


def _ppo_init(shape: list[str], tmp: Path) -> str:
    """PPO's starting policy: the 25M GPT after one SFT step, in one process."""
    launch(1, [*shape[:6], "--steps", "1", "--batch-size", "8"], keep=tmp)
    return str(tmp / "run" / "model")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--fsdp", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--only", choices=("throughput", "memory"))
    ap.add_argument("--trainer", default="sft", help=argparse.SUPPRESS)
    ap.add_argument("--init", help=argparse.SUPPRESS)
    ap.add_argument(
        "--trainers", nargs="+", default=("sft", "rm", "ppo"), choices=("sft", "rm", "ppo"), help="memory rows"
    )
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.only != "memory":
        print("SFT throughput, tiny GPT (0.8M params), global batch", args.batch_size, f"({args.steps} steps)")
        print(f"{'setup':<34}{'median step s':>15}{'tokens/s':>12}{'vs 1 proc':>11}")
        base = None
        for label, nproc, threads in (
            ("1 process, 1 thread", 1, 1),
            ("1 process, 2 threads", 1, 2),
            ("2 processes (DDP), 1 thread each", 2, 1),
        ):
            recs = launch(
                nproc, ["--steps", str(args.steps), "--batch-size", str(args.batch_size), "--threads", str(threads)]
            )
            step = max(r["median_step_s"] for r in recs)
            tps = recs[0]["tokens_per_step"] / step  # metrics.jsonl (rank 0's) counts the global batch's tokens
            base = base or tps
            print(f"{label:<34}{step:>15.4f}{tps:>12.0f}{tps / base:>10.2f}x")
    if args.only != "throughput":
        shape = ["--layers", "8", "--heads", "8", "--width", "512", "--steps", "4", "--batch-size", "8"]
        print("\npeak RSS per process, GPT 8 x 512 (25M params), AdamW, 2 processes")
        print(f"{'setup':<40}{'rank 0 MB':>12}{'rank 1 MB':>12}")
        with tempfile.TemporaryDirectory() as tmp:
            init = _ppo_init(shape, Path(tmp)) if "ppo" in args.trainers else None
            for trainer in args.trainers:
                extra = ["--trainer", trainer] + (["--init", init] if trainer == "ppo" else [])
                for label, flag in (("DDP (full copy on each rank)", []), ("FSDP2 (sharded)", ["--fsdp"])):
                    recs = launch(2, [*shape, *extra, *flag])
                    row = f"{trainer} {label}"
                    print(f"{row:<40}{recs[0]['peak_rss_mb']:>12.0f}{recs[1]['peak_rss_mb']:>12.0f}", flush=True)


if __name__ == "__main__":
    main()
