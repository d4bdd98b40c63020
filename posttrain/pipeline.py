"""The end-to-end demo on the embedded default: each stage's held-out accuracy, side by side.

Stage 1 (now): SFT on a few hundred demonstrations -> held-out greedy accuracy.
Later stages (RL with the verifier, preference optimisation) start from the SFT checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.trainers.sft import SFTConfig, train_sft


def run_demo(out: str, sft_steps: int | None = None) -> dict:
    out_dir = Path(out)
    sft_cfg = SFTConfig(out=str(out_dir / "sft"), **({"steps": sft_steps} if sft_steps else {}))
    sft = train_sft(sft_cfg)
    table = {"sft": sft["heldout_accuracy"]}
    print("\nstage      held-out accuracy")
    for stage, acc in table.items():
        print(f"{stage:<10} {acc:.3f}")
    (out_dir / "demo_summary.json").write_text(json.dumps(table, indent=2) + "\n")
    return table
