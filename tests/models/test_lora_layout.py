"""A LoRA run's outputs, laid out as TRL/peft save them: ``model/`` is the adapter alone pointing at its base (no
base weights, no optimizer state), periodic checkpoints under ``checkpoints/`` keep what resuming needs, and
``--merge-lora`` still writes merged full weights. Oracle: transformers (with peft) loading ``model/`` itself."""

import json
import sys
from pathlib import Path

import pytest
import torch

tf = pytest.importorskip("transformers")
pytest.importorskip("peft")

sys.path.insert(0, str(Path(__file__).parent))  # the suite runs with --import-mode=importlib
from _hfdirs import demos_file, make_model_dir  # noqa: E402

from posttrain.checkpoints.load import load_policy  # noqa: E402
from posttrain.cli import main  # noqa: E402


def _sft(base, data, out, *extra):
    argv = ["sft", "--model", str(base), "--data", str(data), "--eval-data", str(data), "--out", str(out)]
    argv += ["--lora-r", "2", "--steps", "4", "--batch-size", "4", "--lr", "5e-2", "--warmup-steps", "0"]
    return main(
        [*argv, "--eval-every", "0", "--save-every", "2", "--progress", "false", "--max-new-tokens", "2", *extra]
    )


def test_sft_lora_model_dir_is_the_adapter_and_checkpoints_resume(tmp_path):
    base, data = make_model_dir(tmp_path / "base", "gpt2"), demos_file(tmp_path / "d.jsonl")
    out = tmp_path / "run"
    assert _sft(base, data, out) == 0
    names = {p.name for p in (out / "model").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names
    assert not names & {"model.safetensors", "optimizer.pt", "config.json"}, names
    assert json.loads((out / "model" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        base.resolve()
    )
    assert (out / "checkpoints" / "step-00000002" / "optimizer.pt").is_file()  # optimizer state: checkpoints only

    ours = load_policy(out)  # a run directory: its model/, base + adapter
    x = torch.tensor([ours.tokenizer.encode("1+2=3")])
    hf = tf.AutoModelForCausalLM.from_pretrained(str(out / "model"))  # transformers + peft: the base it names
    torch.testing.assert_close(hf(x).logits, ours.model(x).logits, atol=1e-5, rtol=1e-5)
    assert main(["eval", str(out), "--data", str(data), "--max-new-tokens", "2"]) == 0

    # extending the finished run resumes from the last periodic checkpoint (model/ holds no optimizer state)
    assert main(["sft", "--resume", str(out), "--steps", "6", "--progress", "false"]) == 0
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 6

    merged = tmp_path / "merged"
    assert _sft(base, data, merged, "--merge-lora") == 0
    names = {p.name for p in (merged / "model").iterdir()}
    assert "model.safetensors" in names and "adapter_config.json" not in names
