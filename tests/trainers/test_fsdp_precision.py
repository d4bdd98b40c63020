"""Mixed precision under several processes (2 gloo processes on the CPU): ``--fsdp`` with ``--dtype bf16`` / ``fp16``
all-gathers the shards in the compute dtype and reduces gradients in fp32 (FSDP2's ``MixedPrecisionPolicy``), DDP
computes under autocast on fp32 weights; both train close to the fp32 run, and the checkpoints stay fp32.

The oracle is the same 2-process FSDP run in fp32 (itself checked against one process in ``test_distributed.py``);
what each forward saw (weights, outputs) is read by a hook on a block's first linear layer.
"""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import json, os, sys, torch, torch.distributed as dist
    import posttrain.trainers.common as common
    from posttrain.models.gpt import GPTConfig
    from posttrain.tasks.arithmetic import ArithmeticConfig
    from posttrain.trainers.sft import SFTConfig, train_sft
    rank, world, init_file, out, mode, dtype = sys.argv[1:7]
    rank, world = int(rank), int(world)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    seen = {}
    make_optimizer = common.make_optimizer

    def probe(model, *args, **kwargs):  # called once the model is placed and sharded (or DDP-wrapped)
        fc = model.blocks[0].mlp.fc
        seen["stored"] = sorted({f"{type(p).__name__}:{p.dtype}" for p in model.parameters()})

        def hook(mod, inputs, output):
            if "weight" not in seen and torch.is_grad_enabled():
                seen.update(weight=str(mod.weight.dtype), output=str(output.dtype), policy=str(
                    getattr(getattr(model, "_get_fsdp_state", lambda: None)(), "_mp_policy", None)))
        fc.register_forward_hook(hook)
        return make_optimizer(model, *args, **kwargs)

    common.make_optimizer = probe
    cfg = SFTConfig(out=out, steps=4, batch_size=12, grad_accum=2, lr=3e-3, warmup_steps=1, eval_every=0,
                    save_every=2, progress=False, max_new_tokens=4, fsdp=mode == "fsdp", dtype=dtype,
                    model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=32),
                    task=ArithmeticConfig(num_demos=40, num_eval=8))
    train_sft(cfg)
    with open(f"{out}.probe.{rank}.json", "w") as f:
        json.dump(seen, f)
    from posttrain.trainers.distributed import leave_process_group
    leave_process_group()  # gc, barrier, destroy: no teardown abort
""")


def _run(tmp_path: Path, mode: str, dtype: str) -> Path:
    out = tmp_path / f"{mode}-{dtype}"
    init = tmp_path / f"{mode}-{dtype}.rendezvous"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(r), "2", str(init), str(out), mode, dtype],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return out


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def _probe(run: Path) -> list[dict]:
    return [json.loads(Path(f"{run}.probe.{r}.json").read_text()) for r in range(2)]


def _dtypes(safetensors_file: Path) -> set:
    with safe_open(str(safetensors_file), "pt") as f:
        return {f.get_slice(k).get_dtype() for k in f.keys()}


# bf16 keeps 8 bits of mantissa (2^-9 ~ 0.2 % relative per rounding, ~0.006 on a loss of 2.8); over a tiny model and
# four steps the losses stay within 0.02 + 1 % of fp32's (measured: within 3e-4 in bf16 and fp16, FSDP and DDP alike)
ATOL, RTOL = 0.02, 0.01


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("fsdp32"), "fsdp", "fp32")


def test_policy_of_each_dtype():
    from posttrain.trainers.sharded import mixed_precision

    assert mixed_precision("fp32") is None  # fp32: fully_shard(module) exactly as without --dtype
    for dtype, want in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        p = mixed_precision(dtype)
        assert (p.param_dtype, p.reduce_dtype) == (want, torch.float32)


def test_fsdp_fp32_passes_no_policy(fp32):
    for seen in _probe(fp32):
        assert seen["stored"] == ["DTensor:torch.float32"]
        assert (seen["weight"], seen["output"]) == ("torch.float32", "torch.float32")
        assert "param_dtype=None" in seen["policy"] and "reduce_dtype=None" in seen["policy"]  # FSDP's default


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_fsdp_mixed_precision_trains_close_to_fp32_and_saves_fp32(dtype, fp32, tmp_path):
    run = _run(tmp_path, "fsdp", dtype)
    compute = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}[dtype]
    for seen in _probe(run):  # the shards stay fp32; each forward computes on all-gathered compute-dtype weights
        assert seen["stored"] == ["DTensor:torch.float32"]
        assert seen["weight"] == seen["output"] == compute
        assert f"param_dtype={compute}" in seen["policy"] and "reduce_dtype=torch.float32" in seen["policy"]
    want, got = _losses(fp32), _losses(run)
    assert len(got) == len(want) == 4 and all(math.isfinite(x) for x in got)
    assert got != want  # the policy really computed in the lower precision
    for g, w in zip(got, want):
        assert abs(g - w) <= ATOL + RTOL * abs(w), (got, want)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["dtype"] == dtype
    if dtype == "fp16":  # the loss scale reaches the sharded parameters (no "outside its placed models" error)
        assert summary["fp16_overflow_steps"] == 0
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert all(r["loss_scale"] == 2.0**16 for r in rows if "loss" in r)
    assert _dtypes(run / "model" / "model.safetensors") == {"F32"}  # gathered whole: fp32 safetensors
    from posttrain.trainers.sharded import consolidate

    plain = consolidate(run / "checkpoints" / "step-00000002", tmp_path / "consolidated")  # the fp32 shards
    assert _dtypes(plain / "model.safetensors") == {"F32"}


def test_ddp_bf16_computes_under_autocast_on_fp32_weights(fp32, tmp_path):
    run = _run(tmp_path, "ddp", "bf16")
    for seen in _probe(run):  # no policy: the weights stay fp32, autocast lowers the matmul
        assert seen["stored"] == ["Parameter:torch.float32"]
        assert (seen["weight"], seen["output"], seen["policy"]) == ("torch.float32", "torch.bfloat16", "None")
    want, got = _losses(fp32), _losses(run)
    assert all(math.isfinite(x) for x in got) and got != want
    for g, w in zip(got, want):
        assert abs(g - w) <= ATOL + RTOL * abs(w), (got, want)
    assert _dtypes(run / "model" / "model.safetensors") == {"F32"}
