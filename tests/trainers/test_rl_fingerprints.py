"""Short GRPO and PPO runs on the embedded task, held against the record of the same runs made before the RL rollout
became a pure function of values (``trainers/rl/``): the rollout's refactors must leave every run as it was.

The oracle is the pre-change output, ``rl_fingerprints.json``: per run, every logged metric of every step (timings
left out) and the sha256 of the final ``model.safetensors``. Where torch's build and the CPU kind (model and kernel
ISA) are the recorded ones, the metrics are compared to 1e-6 (absolute floor) and the weights bit for bit; on another
CPU kind, whose kernels round differently, the metrics to 1e-3 (a changed sample moves them far more). The runs cover the rollout's branches: group advantages with a
reference model, dynamic sampling with the prompt filter and an annealed reward term, KL folded into the reward,
the skewed engine's truncated IS, and PPO with its critic and GAE (the first forward folded, and split minibatches).

Rewrite the record (only when a change is *meant* to change runs, and say why in the commit):
``.venv/bin/python tests/trainers/test_rl_fingerprints.py``.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from posttrain.models.gpt import GPTConfig
from posttrain.pipeline.run import cpu_description
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers.policy_gradient import PolicyGradientConfig, train_policy_gradient
from posttrain.trainers.ppo import PPOConfig, train_ppo
from posttrain.trainers.sft import SFTConfig, train_sft

RECORD = Path(__file__).with_name("rl_fingerprints.json")
TASK = ArithmeticConfig(digits=1, num_demos=30, num_eval=8)
COMMON = dict(
    steps=3,
    prompts_per_step=4,
    num_generations=4,
    max_new_tokens=4,
    eval_every=0,
    save_every=0,
    progress=False,
    task=TASK,
    warmup_steps=0,
    threads=1,
    lr=3e-3,
)
RUNS = {
    "grpo": ("grpo", dict(beta=0.05, mu=2, minibatches=2, dynamic_sampling=False)),
    "grpo_dynamic_filter_anneal": (
        "grpo",
        dict(
            beta=0.05,
            temperature=2.0,
            dynamic_sampling=True,
            max_sample_rounds=3,
            prompt_filter=True,
            prompt_filter_p=0.3,
            prompt_filter_fill=False,
            reward="exact_match:1.0,digits:0.5",
            reward_anneal="digits",
            reward_anneal_start=0.3,
        ),
    ),
    "rloo_kl_in_reward_adaptive": (
        "grpo",
        dict(algo="rloo", beta=0.1, kl_in="reward", kl_control="adaptive", dynamic_sampling=False, temperature=1.5),
    ),
    "grpo_skewed_tis": ("grpo", dict(engine="skewed", tis_cap=1.05, beta=0.0, mu=2, dynamic_sampling=False)),
    "ppo": ("ppo", dict(missing_eos_penalty=-1.0)),
    "ppo_skewed_minibatches": (
        "ppo",
        dict(engine="skewed", tis_level="sequence", mu=2, minibatches=2, missing_eos_penalty=-1.0, whiten_rewards=True),
    ),
}
TIMING = ("time_", "step_time", "_per_s", "seconds", "mfu", "peak_memory")


def _metrics(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMING)} for r in rows]


def _sft(out: Path) -> Path:
    train_sft(
        SFTConfig(
            out=str(out),
            steps=30,
            batch_size=16,
            eval_every=0,
            save_every=0,
            progress=False,
            task=TASK,
            threads=1,
            val_fraction=0,
            model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24),
        )
    )
    return out


def fingerprint(name: str, sft_dir: Path, root: Path) -> dict:
    kind, kw = RUNS[name]
    out = root / name
    cfg = {**COMMON, **kw, "init": str(sft_dir), "out": str(out)}
    if kind == "grpo":
        train_policy_gradient(PolicyGradientConfig(**cfg))
    else:
        train_ppo(PPOConfig(**cfg))
    weights = hashlib.sha256((out / "model" / "model.safetensors").read_bytes()).hexdigest()
    return {"weights": weights, "metrics": _metrics(out / "metrics.jsonl")}


def _where() -> dict:
    """What decides the rounding: torch's build and the CPU kind with the vector ISA its kernels dispatch to."""
    return {"torch": torch.__version__, "machine": platform.machine(), "cpu": cpu_description()}


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    return _sft(tmp_path_factory.mktemp("sft_fp"))


@pytest.mark.parametrize("name", list(RUNS))
def test_run_matches_its_record(sft_dir, tmp_path, name):
    record = json.loads(RECORD.read_text())
    want, got = record["runs"][name], fingerprint(name, sft_dir, tmp_path)
    here = record["where"] == _where()  # the recorded rounding: 1e-6 and the weights bit for bit
    tol = 1e-6 if here else 1e-3  # another CPU kind rounds kernels differently (three steps drift ~1e-5)
    assert len(got["metrics"]) == len(want["metrics"])
    for g, w in zip(got["metrics"], want["metrics"]):
        assert sorted(g) == sorted(w), (g["step"], sorted(set(g) ^ set(w)))
        for k, v in w.items():
            if isinstance(v, float) and not math.isnan(v):
                assert g[k] == pytest.approx(v, abs=tol, rel=tol), (w["step"], k)
            elif isinstance(v, float):
                assert math.isnan(g[k]), (w["step"], k)
            else:
                assert g[k] == v, (w["step"], k)
    if here:
        assert got["weights"] == want["weights"]


if __name__ == "__main__":  # rewrite the record
    with tempfile.TemporaryDirectory() as d:
        sft = _sft(Path(d) / "sft")
        runs = {n: fingerprint(n, sft, Path(d)) for n in (sys.argv[1:] or RUNS)}
    RECORD.write_text(json.dumps({"where": _where(), "runs": runs}, indent=1, sort_keys=True) + "\n")
    print(RECORD, {n: r["weights"][:12] for n, r in runs.items()})
