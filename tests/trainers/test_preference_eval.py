"""``dpo --eval-data pairs.jsonl`` reports TRL's held-out metrics (eval_loss, eval_rewards/accuracies, margins...).

Oracle: the DPO formulas written out here on log-probs of the final model and of the frozen reference (the SFT
checkpoint), computed pair by pair: r = beta * (log pi - log pi_ref), loss = mean -log sigma(r_w - r_l).
"""

import json
import math

import pytest
import torch

from posttrain.checkpoints.load import load_checkpoint
from posttrain.cli import main
from posttrain.data.preference import load_preference_pairs
from posttrain.models.gpt import GPTConfig
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers.dpo import DPOConfig, train_dpo
from posttrain.trainers.preference_data import PairedData, seq_logps
from posttrain.trainers.sft import SFTConfig, train_sft

TASK = ArithmeticConfig(digits=1, num_demos=20, num_eval=8)


@pytest.fixture(scope="module")
def sft_ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft")
    model = GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24)
    train_sft(SFTConfig(out=str(out), steps=8, batch_size=8, eval_every=0, save_every=0, progress=False,
                        model=model, task=TASK))  # fmt: skip
    return str(out)


def _pairs(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _rows(lo, hi):
    return [
        {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)} for a in range(lo, hi) for b in (1, 3)
    ]


def _logps(model_dir, path, cfg):
    ck = load_checkpoint(model_dir)
    pairs = load_preference_pairs(path)
    data = PairedData(pairs, ck.tokenizer, cfg)
    ck.model.eval()
    with torch.no_grad():
        lp, _ = seq_logps(ck.model, data.collate(list(range(len(pairs)))))
    n = len(pairs)
    return lp[:n].double(), lp[n:].double()


def test_dpo_eval_pairs_give_trl_metrics(tmp_path, sft_ckpt):
    data, held = _pairs(tmp_path / "train.jsonl", _rows(0, 5)), _pairs(tmp_path / "held.jsonl", _rows(5, 9))
    cfg = DPOConfig(out=str(tmp_path / "dpo"), init=sft_ckpt, data=data, eval_data=held, loss="sigmoid", beta=0.5,
                    steps=4, batch_size=4, eval_every=2, save_every=0, warmup_steps=0, progress=False, lr=3e-2)  # fmt: skip
    summary = train_dpo(cfg)
    pc, pr = _logps(tmp_path / "dpo" / "model", held, cfg)
    rc, rr = _logps(sft_ckpt, held, cfg)
    r_w, r_l = 0.5 * (pc - rc), 0.5 * (pr - rr)
    want = {
        "eval_loss": float(-torch.nn.functional.logsigmoid(r_w - r_l).mean()),
        "eval_rewards/accuracies": float((r_w > r_l).double().mean()),
        "eval_rewards/margins": float((r_w - r_l).mean()),
        "eval_rewards/chosen": float(r_w.mean()),
        "eval_logps/rejected": float(pr.mean()),
    }
    for k, v in want.items():
        assert summary[k] == pytest.approx(v, abs=1e-5, rel=1e-4), k
    assert summary["eval_pairs"] == 8 and summary["heldout_n"] == 8  # generation eval on (prompt, chosen) too
    logged = [json.loads(x) for x in (tmp_path / "dpo" / "metrics.jsonl").read_text().splitlines()]
    at_eval = [r for r in logged if "eval_loss" in r]
    assert [r["step"] for r in at_eval] == [2, 4] and all(math.isfinite(r["eval_loss"]) for r in at_eval)
    assert at_eval[-1]["eval_loss"] == pytest.approx(summary["eval_loss"], abs=1e-6)


def test_dpo_cli_takes_a_pairs_eval_file(tmp_path, sft_ckpt, capsys):
    data, held = _pairs(tmp_path / "train.jsonl", _rows(0, 4)), _pairs(tmp_path / "held.jsonl", _rows(4, 6))
    argv = ["dpo", "--init", sft_ckpt, "--data", data, "--eval-data", held, "--out", str(tmp_path / "run")]
    assert main([*argv, "--steps", "2", "--batch-size", "4", "--progress", "false", "--loss", "ipo"]) == 0
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {"eval_loss", "eval_rewards/accuracies", "eval_rewards/margins"} <= set(s)
