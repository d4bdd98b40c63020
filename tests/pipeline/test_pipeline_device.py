"""The pipeline's ``--device`` / ``--dtype``: every training stage trains with them (a bf16 ``micro`` run on the CPU), a
stage section that disagrees and fp16 are refused, and ``--device cuda`` without CUDA is one line, exit 2."""

import json
import math

import pytest
import torch

from posttrain.cli import main
from posttrain.config import build_config
from posttrain.errors import ConfigError
from posttrain.pipeline.config import PRESETS, PipelineConfig
from posttrain.pipeline.stages import STAGES

TRAINING = [s.name for s in STAGES if hasattr(s.run, "trainer")]


def test_the_training_stages_are_every_trainer():
    assert sorted(TRAINING) == ["dpo", "grpo", "ppo", "rm", "sft", "sft_raw"]


def test_bf16_micro_pipeline_trains_every_stage_in_bf16(tmp_path):
    out = tmp_path / "pipe"
    assert (
        main(["pipeline", "--preset", "micro", "--dtype", "bf16", "--device", "cpu", "--quiet", "--out", str(out)]) == 0
    )
    for stage in TRAINING:
        cfg = json.loads((out / stage / "config.resolved.json").read_text())
        assert (cfg["dtype"], cfg["device"]) == ("bf16", "cpu"), stage  # what the stage's trainer was given
        summary = json.loads((out / stage / "summary.json").read_text())
        assert (summary["dtype"], summary["device"]) == ("bf16", "cpu"), stage  # what its run used
        logs = sorted((out / stage).glob("**/metrics.jsonl"))  # SFT: one per restart (restarts/N/)
        losses = [r["loss"] for f in logs for r in map(json.loads, f.open()) if "loss" in r]
        assert losses and all(math.isfinite(x) for x in losses), stage
    restarts = sorted((out / "sft" / "restarts").glob("*/config.resolved.json"))  # each SFT restart in bf16 too
    assert len(restarts) == 2 and all(json.loads(f.read_text())["dtype"] == "bf16" for f in restarts)
    assert json.loads((out / "summary.json").read_text())  # the pipeline finished: eval and report too


def test_defaults_leave_every_stage_config_as_before():
    cfg = build_config(PipelineConfig, PRESETS["micro"])
    assert (cfg.device, cfg.dtype) == ("auto", "fp32")  # the trainers' own defaults: the stage keys do not change
    assert all(
        (getattr(cfg, s).device, getattr(cfg, s).dtype) == ("auto", "fp32") for s in ("sft", "rm", "dpo", "grpo")
    )


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"sft.dtype": "bf16"}, "sft.dtype='bf16' and dtype='fp32': the top-level dtype is every training stage's"),
        ({"ppo": {"device": "cpu"}, "device": "auto"}, "ppo.device='cpu' and device='auto'"),
        ({"dtype": "fp16"}, "dtype=fp16: the rm and ppo stages do not train in fp16; use dtype=bf16"),
    ],
)
def test_a_stage_section_that_disagrees_and_fp16_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_config(PipelineConfig, PRESETS["micro"], overrides=overrides)
    agreed = build_config(PipelineConfig, PRESETS["micro"], overrides={"sft.dtype": "bf16", "dtype": "bf16"})
    assert agreed.sft.dtype == "bf16"  # the same value in a section and at the top is fine


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_is_one_line_exit_2(tmp_path, capsys):
    out = tmp_path / "pipe"
    assert main(["pipeline", "--preset", "micro", "--device", "cuda", "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--device cuda: no CUDA device is available" in lines[0], lines
    assert not out.exists()  # refused before any stage ran
