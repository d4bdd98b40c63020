"""One setup and resume sequence for every trainer, in one order: :func:`open_training`.

    threads -> distributed.init -> open_run -> seeding -> model (sharded / plain resume, --init / --model, fresh)
    -> check_resume_step -> the trainer's inputs (validated, nothing written yet) -> begin_run -> the inputs made in
    the run directory -> placement
    (device; FSDP shards or the DDP wrapper) -> optimizer -> optimizer state and RNG restore -> MetricsLogger
    -> CheckpointManager

A trainer supplies only what is its own, as two functions of values:

- ``build(start) -> (model, tokenizer)``: its model from a :class:`Start` (the resumed checkpoint, the ``--init`` /
  ``--model`` start, or neither: a fresh model), e.g. a reward model wraps the start in a scalar head;
- ``inputs(t) -> anything``: its data, read and checked against the model and tokenizer before ``begin_run``
  writes the run directory (a bad file is an error with nothing written); the result is ``t.inputs``;
- ``run_inputs(t) -> anything`` (optional): what is made into the run directory right after ``begin_run``, before
  the model is placed or sharded (pairs sampled from the start and cached there, a reference model's precomputed
  log-probs); its result replaces ``t.inputs``. It may draw random numbers: on a fresh run they come from the
  seeded stream as they always did; a resumed run reads its cache and restores the RNG state after it.

Seeded resume: the optimizer state and the RNG state (global torch RNG and the trainer's own generators, passed as
``generators``) come back from the checkpoint after the optimizer is built, so a run resumed at step k continues
bitwise as the uninterrupted one.

Device and precision: :func:`place_model` is the one call site where the model is placed before its optimizer is
built; on CPU it returns the model unchanged (the CPU path stays bitwise).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch

from posttrain.checkpoints.load import load_checkpoint
from posttrain.trainers import common, distributed, sharded
from posttrain.trainers.checkpoint import CheckpointManager, restore_rng, start_policy
from posttrain.trainers.engine import device


@dataclass
class Start:
    """Where a run's model comes from: ``ckpt`` (the checkpoint a resumed run continues from: plain, or sharded with
    its weights still to come with the optimizer state), ``init`` (the ``--init`` / ``--model`` start; also loaded on
    resume for trainers that keep it, as a reference or a sampler), or neither (a fresh model)."""

    ckpt: Any = None
    init: Any = None

    @property
    def step(self) -> int:
        return self.ckpt.step if self.ckpt is not None else 0


@dataclass
class Training:
    """What :func:`open_training` hands a trainer: the run, its model, optimizer, logger and checkpoint manager."""

    cfg: Any
    run: common.Run
    world: distributed.World
    start: Start
    model: torch.nn.Module
    tokenizer: Any
    resumed: bool = False
    inputs: Any = None  # what the trainer's ``inputs`` returned
    train_model: torch.nn.Module | None = None  # the model, or its DDP wrapper under torchrun (forward + backward)
    opt: torch.optim.Optimizer | None = None
    logger: common.MetricsLogger | None = None
    manager: CheckpointManager | None = None
    parts: dict = dataclasses.field(default_factory=dict)  # other trained modules: {name: (module, optimizer)}

    @property
    def start_step(self) -> int:
        return self.start.step

    @property
    def ckpt(self):
        return self.start.ckpt

    @property
    def init(self):
        return self.start.init

    def state_parts(self) -> dict:
        """What a trainer's state holds of the run, as keywords: ``State(cfg, **t.state_parts(), ...)``."""
        names = ("run", "model", "tokenizer", "opt", "logger", "manager", "start_step", "world", "train_model")
        return {k: getattr(self, k) for k in names}


def place_model(model: torch.nn.Module, cfg) -> torch.nn.Module:
    """Where the model lives and in which precision, decided once before the optimizer is built: the run's device
    (:func:`open_training` resolves ``cfg.device`` first of all), fp32 weights, every forward under the
    ``cfg.dtype`` autocast, ``--grad-checkpointing`` and ``--compile`` (``engine/device.py``). On the CPU in fp32 the
    model computes bitwise as it is; its training forwards are counted (tokens/s)."""
    run_device = device.active()
    return model if run_device is None else device.place(model, run_device)


def read_start(cfg, trainer: str, run: common.Run, resume: str | None, keep_init: bool, command: str) -> Start:
    """The resumed checkpoint (sharded under --fsdp, else plain with its optimizer and RNG state) and/or the
    ``--init`` / ``--model`` start (on resume only when ``keep_init``)."""
    start = Start()
    if resume and sharded.is_sharded_checkpoint(run.resume_from):  # written under --fsdp: weights come with the
        start.ckpt = sharded.read_sharded_checkpoint(run.resume_from, expect_trainer=trainer)  # optimizer state
    elif resume:
        start.ckpt = load_checkpoint(run.resume_from, with_training_state=True, expect_trainer=trainer)
    if not resume or keep_init:
        start.init = start_policy(cfg, command)  # None without --init / --model
    return start


def open_training(
    cfg,
    trainer: str,
    resume: str | None = None,
    overwrite: bool = False,
    *,
    build: Callable[[Start], tuple[torch.nn.Module, Any]],
    inputs: Callable[[Training], Any] | None = None,
    run_inputs: Callable[[Training], Any] | None = None,
    keep_init: bool = False,
    generators: dict[str, torch.Generator] | None = None,
    command: str | None = None,
    parts: Callable[[Training], dict] | None = None,
) -> Training:
    """Open a run of ``trainer`` ("sft", "rm", ...; as its checkpoints name it) with ``cfg`` in the one order (module
    docstring); ``command`` is what messages about its start call it (default ``trainer``: "grpo" for
    "policy_gradient"); ``parts(t) -> {name: (module, optimizer)}``, called once the model's optimizer is built, gives
    the trainer's other trained modules (PPO's critic: sharded beside the policy under --fsdp, and restored with it
    from a sharded checkpoint; from a plain one the trainer reads them itself)."""
    common.set_threads(cfg.threads)
    world = distributed.init()  # one process, or this rank under torchrun
    where = device.resolve_device(getattr(cfg, "device", "cpu"), world.local_rank)  # --device cuda without one: exit 2
    device.check_precision(trainer, cfg.dtype)
    device.activate(
        device.RunDevice(where, cfg.dtype, cfg.grad_checkpointing, getattr(cfg, "compile", False))
    )  # before any model is built: references made from here on (common.frozen) go to the device too
    run = common.open_run(cfg, trainer, resume=resume, overwrite=overwrite)
    common.seed_everything(cfg.seed)
    start = read_start(cfg, trainer, run, resume, keep_init, command or trainer)
    model, tokenizer = build(start)
    if start.ckpt is not None:
        common.check_resume_step(start.ckpt.path, start.step, cfg.steps)
    t = Training(cfg, run, world, start, model, tokenizer, resumed=bool(resume))
    if inputs is not None:
        t.inputs = inputs(t)  # the trainer's data, validated: nothing is written before this
    common.begin_run(run, cfg)  # inputs validated: from here on the run directory is written
    if run_inputs is not None:
        t.inputs = run_inputs(t)
    t.inputs = device.to_device(t.inputs)  # the trainer's tensors on the run's device (on the CPU: as they are)

    t.model = place_model(t.model, cfg)
    fsdp = getattr(cfg, "fsdp", False) and world.distributed
    if fsdp:
        # in place; FSDP's hooks reduce the gradients (no DDP wrapper); bf16/fp16: compute-dtype all-gathers, fp32
        # reduce-scatter (sharded.mixed_precision), and fp16's loss scale covers the new (sharded) parameters
        sharded.shard_model(t.model, cfg.dtype)
        device.mark_scaled(t.model)
    elif getattr(cfg, "fsdp", False):
        print("--fsdp on one process: nothing to shard, training unsharded (run under torchrun to shard)")
    t.train_model = t.model if fsdp else distributed.wrap_ddp(t.model, world)
    t.opt = common.make_optimizer(t.model, cfg.lr, cfg.weight_decay)
    t.parts = parts(t) if parts is not None else {}
    for module, _ in t.parts.values():  # PPO's critic: placed like the model (.to() keeps its optimizer's parameters)
        place_model(module, cfg)
    ckpt = start.ckpt
    if ckpt is not None:
        if sharded.is_sharded_checkpoint(ckpt.path):  # a sharded checkpoint (any world size): model and optimizer
            sharded.load_sharded_checkpoint(ckpt.path, t.model, t.opt, parts=t.parts or None)
        elif ckpt.optimizer_state is not None:
            t.opt.load_state_dict(ckpt.optimizer_state)
        if ckpt.rng_state is not None:
            restore_rng(ckpt.rng_state, generators)
    t.logger = common.MetricsLogger(run.dir, cfg.logger, resume_step=start.step if resume else None)
    t.manager = CheckpointManager(run.dir, keep=cfg.keep_checkpoints)
    return t
