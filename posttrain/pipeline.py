"""The end-to-end demo on the embedded default: each stage's held-out accuracy, side by side.

    SFT on a few hundred demonstrations         -> greedy held-out accuracy
    GRPO from the SFT checkpoint (verifier)      -> accuracy after RL on prompts without answers
    DPO from the SFT checkpoint (on-policy pairs) -> accuracy after preference optimisation

Every stage writes its own run directory (metrics.jsonl, summary.json, model/) under ``--out``; the
table is printed and saved as ``demo_summary.json``. Stages that are not installed are skipped with a note.

The demo is ONE seed (printed first, and saved in the summary): a single run says little about what to
expect, since outcomes vary from seed to seed. For distributions (mean ± sd over seeds, the worst seed) run
``benchmarks/bench_outcomes.py`` (docs/outcomes.md).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from posttrain.data.io import atomic_write_json


def run_demo(out: str, sft_steps: int | None = None, rl_steps: int | None = None, dpo_steps: int | None = None,
             seed: int = 0) -> dict:
    from posttrain.trainers.policy_gradient import PolicyGradientConfig, train_policy_gradient
    from posttrain.trainers.sft import SFTConfig, train_sft

    out_dir = Path(out)
    table: dict[str, dict] = {}
    print(f"demo seed: {seed} (one seed; for mean ± sd over seeds and the worst seed: benchmarks/bench_outcomes.py)")

    print("=== stage 1/3: SFT on the embedded task's demonstrations ===")
    sft_cfg = SFTConfig(out=str(out_dir / "sft"), seed=seed, **({"steps": sft_steps} if sft_steps else {}))
    sft = train_sft(sft_cfg, overwrite=True)  # the demo owns its run directories: a rerun starts afresh
    table["sft"] = {"heldout_accuracy": sft["heldout_accuracy"], "seconds": sft["train_seconds"]}

    print("\n=== stage 2/3: GRPO from the SFT checkpoint, rewarded by the exact-match verifier ===")
    rl_cfg = PolicyGradientConfig(init=str(out_dir / "sft"), out=str(out_dir / "grpo"), seed=seed,
                                  **({"steps": rl_steps} if rl_steps else {}))
    rl = train_policy_gradient(rl_cfg, overwrite=True)
    table["grpo"] = {"heldout_accuracy": rl["heldout_accuracy"], "seconds": rl["train_seconds"]}

    print("\n=== stage 3/3: DPO from the SFT checkpoint on on-policy, verifier-labelled pairs ===")
    if importlib.util.find_spec("posttrain.trainers.dpo") is not None:
        from posttrain.trainers.dpo import DPOConfig, train_dpo

        dpo_cfg = DPOConfig(init=str(out_dir / "sft"), out=str(out_dir / "dpo"), seed=seed, **({"steps": dpo_steps} if dpo_steps else {}))
        dpo = train_dpo(dpo_cfg, overwrite=True)
        table["dpo"] = {"heldout_accuracy": dpo["heldout_accuracy"], "seconds": dpo["train_seconds"]}
    else:
        print("(DPO trainer not available in this build; skipped)")

    print(f"\nseed {seed}\nstage   held-out accuracy (greedy)   train seconds")
    for stage, row in table.items():
        print(f"{stage:<7} {row['heldout_accuracy']:>26.3f}   {row['seconds']:>13.1f}")
    atomic_write_json(out_dir / "demo_summary.json", {"seed": seed, **table})
    print(f"\nsummary: {out_dir / 'demo_summary.json'}")
    return table
