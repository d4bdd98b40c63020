"""The pipeline's training stages under ``torchrun``: ``nproc_per_stage = N`` runs each one as N processes.

Key insight: the pipeline itself stays one process (its data stages, cache decisions, evaluation and report need
no second rank); only a training stage is launched, as the command a user would type:

    python -m torch.distributed.run --standalone --nproc-per-node N -m posttrain <sft|rm|dpo|grpo|ppo> \\
        --config OUT/.pipeline/<stage>.config.yaml [--resume OUT/<stage> | --overwrite]

The file holds the stage's resolved config, the object its cache key hashes (every field written, so the
trainer's preset underneath changes nothing); the summary comes back from ``OUT/<stage>/summary.json``, and the
runner writes ``DONE.json`` as for a stage run inline. The trainers' output streams through the runner (to the
terminal, or to ``OUT/.pipeline/<stage>.log`` under ``--quiet``). A stage's section may set ``fsdp = true``
(a trainer field: it travels in the file) to shard its model.

Cache keys. sft, rm and dpo give the same result at any world size (to float tolerance:
tests/trainers/test_distributed.py), so their keys leave N out and a result trained on N processes is reused on
one and vice versa. grpo and ppo draw each rank's samples from the rank's own stream, so their results depend on
N: with N > 1 their keys include ``world_size`` (N = 1 keeps the keys of a pipeline without this option).

Not handled: ``jobs`` > 1 with N > 1 (each stage already takes N processes; refused by the config), several
nodes (launch the trainers with torchrun yourself: docs/distributed.md), GPUs per stage other than one per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from posttrain.errors import UserError
from posttrain.trainers.engine.registry import TRAINERS

COMMANDS = {e.module: command for command, e in TRAINERS.items()}
"""Trainer module -> the ``posttrain`` command torchrun runs (from the one registry, ``trainers/engine/registry.py``)."""

RANK_SAMPLED = ("grpo", "ppo")
"""Stages whose result depends on the number of processes (each rank samples with its own stream)."""


def stage_fields(name: str, fields: dict, cfg) -> dict:
    """A stage's key fields under ``nproc_per_stage`` = N: ``world_size`` added for :data:`RANK_SAMPLED` stages
    when N > 1; unchanged otherwise."""
    n = getattr(cfg, "nproc_per_stage", 1)
    return {**fields, "world_size": n} if n > 1 and name in RANK_SAMPLED else fields


def command(module: str, nproc: int, config_file: Path, out: Path, resume: bool) -> list[str]:
    """The torchrun command line of one training stage."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    argv += ["-m", "posttrain", COMMANDS[module], "--config", str(config_file)]
    if resume:
        argv += ["--resume", str(out)]
    elif out.is_dir() and any(out.iterdir()):
        argv += ["--overwrite"]
    return argv


def _check_round_trip(module: str, cfg, config_file: Path) -> None:
    """What the trainer will build from ``config_file`` (over its default ``tiny`` preset) is ``cfg``, field for
    field; else a one-line error rather than a stage trained on another config than its key says."""
    import importlib
    import json

    from posttrain.config import build_config, to_dict

    rebuilt = build_config(type(cfg), importlib.import_module(module).PRESETS["tiny"], str(config_file))
    same = json.dumps(to_dict(rebuilt), sort_keys=True, default=str) == json.dumps(
        to_dict(cfg), sort_keys=True, default=str
    )
    if not same:
        raise UserError(
            f"{config_file}: the stage's config does not survive the file round trip; run it with nproc_per_stage = 1"
        )


def run_stage(ctx, module: str, cfg, out: Path, resume: bool) -> dict:
    """Train one stage as ``ctx.cfg.nproc_per_stage`` processes under torchrun; returns its summary."""
    from posttrain.checkpoints.layout import read_json_file
    from posttrain.config import dump_yaml
    from posttrain.data.io import atomic_write_text

    nproc, out = ctx.cfg.nproc_per_stage, Path(out)
    config_file = ctx.run_dir / ".pipeline" / f"{out.name}.config.yaml"
    config_file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(config_file, dump_yaml(cfg))
    _check_round_trip(module, cfg, config_file)
    argv = command(module, nproc, config_file, out, resume)
    root = str(Path(__file__).resolve().parents[2])  # the posttrain the runner imported, for every rank
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH")) if x)}
    env["OMP_NUM_THREADS"] = str(getattr(cfg, "threads", None) or 1)
    print(f"{out.name}: {nproc} processes: {' '.join(argv[1:])}", flush=True)
    import functools
    import signal

    from posttrain.pipeline.workers import die_with_parent, libc_prctl

    # torchrun gets SIGTERM if the pipeline dies (kill -9 included), and stops its ranks: no orphaned trainers
    libc_prctl()  # loaded here: the forked child only calls it
    dies = functools.partial(die_with_parent, os.getpid(), signal.SIGTERM)
    with subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=dies
    ) as proc:
        for line in proc.stdout:  # rank 0 prints; the others only their errors
            print(line, end="", flush=True)
    if proc.returncode != 0:
        raise UserError(
            f"{out.name}: `posttrain {COMMANDS[module]}` on {nproc} processes failed (exit {proc.returncode})"
        )
    return read_json_file(out / "summary.json")
