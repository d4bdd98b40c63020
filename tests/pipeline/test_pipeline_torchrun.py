"""The pipeline's training stages under torchrun (``nproc_per_stage = 2``) on the ``micro`` preset.

Oracles: the same SFT stage run in one process (same key, weights equal to float tolerance: the trainers are
world-size invariant), the sharded checkpoint's own record of its world size (FSDP GRPO from a stage section ran on
2 processes), one metrics log per stage (rank 0 writes), and the cache rule (a grpo result depends on the number
of processes, so a 1-process pipeline re-runs it; sft's key does not).
"""

import dataclasses
import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

from posttrain.config import build_config
from posttrain.errors import ConfigError
from posttrain.pipeline.config import PRESETS, PipelineConfig
from posttrain.pipeline.run import run_pipeline
from posttrain.trainers.sft import SFTConfig

pytestmark = pytest.mark.slow  # two torchrun launches of 2 processes (~25 s on the shared 2-core machine)

LATER = ("sft_raw", "rm", "dpo", "ppo", "eval", "report")


def micro(**overrides):  # one SFT run, the RM without its GRM term: neither runs under torchrun
    return build_config(
        PipelineConfig, PRESETS["micro"], overrides={"sft.restarts": 1, "rm.sft_coef": 0.0, **overrides}
    )


def test_training_stages_under_torchrun(tmp_path):
    two = tmp_path / "two"
    cfg = micro(nproc_per_stage=2, **{"grpo.fsdp": True, "grpo.save_every": 2})
    res = run_pipeline(cfg, two, skip=LATER, quiet=True)
    assert {k: res["stages"][k]["status"] for k in ("sft", "grpo")} == {"sft": "ran", "grpo": "ran"}
    assert "grpo: 2 processes:" in (two / ".pipeline" / "grpo.log").read_text()
    # the trainer ran with exactly the stage's resolved config (the file torchrun was given); it saves it less the
    # settings a run on --data never reads (the embedded task's: knob(unused_with=...)), and the sft stage always
    # trains on the dedup stage's corpus file, made from the embedded task here
    sent = yaml.safe_load((two / ".pipeline" / "sft.config.yaml").read_text())
    unused = {f.name for f in dataclasses.fields(SFTConfig) if any(sent[o] for o in f.metadata.get("unused_with", ()))}
    assert sent["data"] and "task" in unused
    saved = json.loads((two / "sft" / "config.resolved.json").read_text())
    assert saved == json.loads(json.dumps({k: v for k, v in sent.items() if k not in unused}))
    st = json.loads((two / "grpo" / "checkpoints" / "step-00000002" / "trainer_state.json").read_text())
    assert st["sharded"] and st["world_size"] == 2  # FSDP on 2 processes, asked for in the grpo section
    for stage, steps in (("sft", 24), ("grpo", 4)):  # one log, written by rank 0
        logged = [json.loads(x)["step"] for x in (two / stage / "metrics.jsonl").read_text().splitlines()]
        assert logged == sorted(set(logged)) and logged[-1] == steps
    # one process: the same SFT key and weights (world-size invariant), so a cached sft is shared
    one = tmp_path / "one"
    run_pipeline(micro(), one, only=("dedup", "tokenizer", "sft"), skip=LATER + ("grpo",), quiet=True)
    done = [json.loads((d / "sft" / "DONE.json").read_text()) for d in (one, two)]
    assert done[0]["key"] == done[1]["key"]
    a, b = (load_file(d / "sft" / "model" / "model.safetensors") for d in (one, two))
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=1e-5, msg=k)
    # grpo's key holds the world size: the same config on one process would run it again, sft would not
    plan = run_pipeline(micro(**{"grpo.fsdp": True, "grpo.save_every": 2}), two, skip=LATER, explain=True)
    assert plan["explain"]["sft"] == "cached" and plan["explain"]["grpo"] == "run"
    assert run_pipeline(cfg, two, skip=LATER, explain=True)["explain"]["grpo"] == "cached"


def test_nproc_per_stage_refuses_parallel_jobs():
    with pytest.raises(ConfigError, match="set jobs = 1"):
        micro(nproc_per_stage=2, jobs=2)
    with pytest.raises(ConfigError, match=r"restarts are not supported: set sft.restarts = 1 \(it is 2\)"):
        micro(nproc_per_stage=2, **{"sft.restarts": 2})
    with pytest.raises(ConfigError, match=r"GRM term is not supported: set rm.sft_coef = 0 \(it is 1.0\)"):
        micro(nproc_per_stage=2, **{"rm.sft_coef": 1.0})


@pytest.mark.parametrize("module", ["sft", "reward", "dpo", "policy_gradient", "ppo"])
def test_each_trainer_config_survives_the_file_torchrun_is_given(tmp_path, module):
    """Every field of a stage's config reaches the trainer over its own preset; a config that would not is refused."""
    import dataclasses

    from posttrain.config import dump_yaml
    from posttrain.errors import UserError
    from posttrain.pipeline.distributed import _check_round_trip

    name = {"reward": "rm", "policy_gradient": "grpo"}.get(module, module)
    base = getattr(micro(), name)
    cfg = dataclasses.replace(base, steps=base.steps + 1, seed=5)  # not the preset's values
    f = tmp_path / "stage.config.yaml"
    f.write_text(dump_yaml(cfg))
    _check_round_trip(f"posttrain.trainers.{module}", cfg, f)
    f.write_text(dump_yaml(dataclasses.replace(cfg, steps=cfg.steps + 1)))
    with pytest.raises(UserError, match="round trip"):
        _check_round_trip(f"posttrain.trainers.{module}", cfg, f)
