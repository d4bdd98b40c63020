"""SFT restarts under several processes (as ``torchrun -m posttrain sft --preset tiny`` runs them): the restarts run
one after another on all processes, and the outcome is the 1-process one. Oracle: the same config in one process
(the kept restart, its weights, the files written)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import os, sys, torch.distributed as dist
    from posttrain.models.gpt import GPTConfig
    from posttrain.tasks.arithmetic import ArithmeticConfig
    from posttrain.trainers.sft import SFTConfig, train_sft
    rank, world, init_file, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if world > 1:
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    cfg = SFTConfig(out=out, steps=4, batch_size=12, lr=3e-3, warmup_steps=1, eval_every=0, save_every=0,
                    progress=False, max_new_tokens=4, restarts=3, restart_probe=0.5, restart_keep=2,
                    val_problems=16, model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=32),
                    task=ArithmeticConfig(num_demos=40, num_eval=8))
    train_sft(cfg)
    from posttrain.trainers.distributed import leave_process_group
    leave_process_group()  # gc, barrier, destroy: no teardown abort
""")


def _run(tmp_path: Path, world: int, name: str) -> Path:
    out, init = tmp_path / name, tmp_path / f"{name}.rendezvous"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([sys.executable, "-c", SCRIPT, str(r), str(world), str(init), str(out)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)
    ]  # fmt: skip
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return out


def test_restarts_under_two_processes_equal_one(tmp_path):
    one, two = _run(tmp_path, 1, "one"), _run(tmp_path, 2, "two")
    s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (one, two))
    assert s2["restarts"] == 3 and s2["selected_restart"] == s1["selected_restart"]
    assert [c["finished"] for c in s2["candidates"]] == [c["finished"] for c in s1["candidates"]]
    for c1, c2 in zip(s1["candidates"], s2["candidates"]):  # the same ranking at the probe and at the end
        assert abs(c1["probe"]["val_accuracy"] - c2["probe"]["val_accuracy"]) < 1e-9
    a, b = load_file(one / "model" / "model.safetensors"), load_file(two / "model" / "model.safetensors")
    for k in a:  # the DDP tolerance of test_distributed.py (summation order over ranks)
        torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=1e-5, msg=k)
    files = lambda d: sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())  # noqa: E731
    assert files(two) == files(one)  # written once, by rank 0
