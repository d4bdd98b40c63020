"""FSDP2 for models whose parameters and optimiser state do not fit one device, and their sharded checkpoints.

Key insight: FSDP shards every parameter (and so its gradient and Adam moments) across the W ranks; a block's
full weights exist only while that block runs (all-gathered before its forward and backward, freed after),
and gradients are reduce-scattered back to the shards. Per-rank memory for parameters + optimiser state falls
from ~4P to ~4P/W floats. We use PyTorch's own engine, ``fully_shard`` (FSDP2), applied per transformer block
then to the root; its gradients are averaged over ranks like DDP's, so the trainers' loss scaling is the same
(:func:`posttrain.trainers.distributed.ddp_loss_scale`).

Checkpoints: each rank writes its own shards with ``torch.distributed.checkpoint`` (DCP) into ``dcp/`` of the
checkpoint directory (model and optimiser; DCP reshards on load, so a run saved on 2 processes resumes on 1
or 4), rank 0 adds ``config.json``, ``tokenizer.json``, ``trainer_state.json`` and its RNG state, and the
directory appears by one rename. A DCP directory is for resuming only; :func:`consolidate` (``posttrain export``)
turns it into a plain checkpoint with one ``model.safetensors``, in one process, with no process group. The
final ``model/`` of a run is written consolidated (gathered to rank 0, offloaded to CPU).

Not handled: mixed precision policies, CPU offload of parameters during training, HF models other than those
with ``model.layers`` / ``transformer.h`` block lists, LoRA under FSDP.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from posttrain.errors import UserError
from posttrain.trainers import distributed

DCP_DIR = "dcp"


def _fully_shard():
    try:  # torch >= 2.6
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.4-2.5 kept it under _composable
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks FSDP shards one by one: posttrain GPT ``blocks``, HF ``model.layers`` or ``transformer.h``."""
    for path in ("blocks", "model.layers", "transformer.h"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, torch.nn.ModuleList):
            return list(obj)
    raise UserError(
        f"--fsdp: cannot find the transformer blocks of a {type(model).__name__} (looked for blocks, "
        f"model.layers, transformer.h)"
    )


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """``fully_shard`` each block, then the root (in place; the module keeps its class and methods)."""
    fully_shard = _fully_shard()
    for block in transformer_blocks(model):
        fully_shard(block)
    fully_shard(model)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def no_sync(model: torch.nn.Module, last: bool):
    """Skip the gradient reduce-scatter on every micro-batch but the last (FSDP2's switch), else DDP's."""
    if is_sharded(model):

        @contextlib.contextmanager
        def ctx():
            model.set_requires_gradient_sync(last)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

        return ctx()
    return distributed.no_sync(model, last)


def _state_dicts(model, optimizer, full: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=full, cpu_offload=full))


def save_sharded_checkpoint(
    directory: str | Path, model, optimizer, tokenizer, state: dict, rng_state: dict | None, w: distributed.World
) -> Path:
    """Every rank writes its shards; rank 0 the rest; the directory replaces an older one by one rename."""
    import torch.distributed.checkpoint as dcp

    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp-sharded")
    if w.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    distributed.barrier(w)
    msd, osd = _state_dicts(model, optimizer, full=False)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / DCP_DIR))
    if w.is_main:
        from posttrain.models import model_config_dict

        (tmp / "config.json").write_text(json.dumps(model_config_dict(model), indent=2) + "\n")
        tokenizer.save(tmp / "tokenizer.json")
        (tmp / "trainer_state.json").write_text(
            json.dumps({**state, "sharded": True, "world_size": w.world_size}, indent=2, default=str) + "\n"
        )
        if rng_state is not None:
            torch.save(rng_state, tmp / "rng.pt")
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
    distributed.barrier(w)
    return directory


@contextlib.contextmanager
def _single_process_ok():
    """DCP warns that it loads "in a single process" when there is no process group: here that is the intent."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def is_sharded_checkpoint(directory: str | Path) -> bool:
    return (Path(directory) / DCP_DIR).is_dir()


def load_sharded_checkpoint(directory: str | Path, model, optimizer) -> None:
    """Load a DCP checkpoint (saved at any world size) into ``model`` and its ``optimizer``: sharded (FSDP, any
    number of processes) or plain (one process without a process group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    p = Path(directory) / DCP_DIR
    if not p.is_dir():
        raise UserError(f"{directory} has no {DCP_DIR}/: not a sharded (--fsdp) checkpoint")
    msd, osd = _state_dicts(model, optimizer, full=False)
    sd = {"model": msd, "optim": osd}
    with _single_process_ok():
        dcp.load(sd, checkpoint_id=str(p), no_dist=not dist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def read_sharded_checkpoint(directory: str | Path, expect_trainer: str):
    """A sharded checkpoint's model (built from ``config.json``, weights not yet loaded: they come with the
    optimiser in :func:`load_sharded_checkpoint`), tokenizer, state and RNG, as a ``Checkpoint``."""
    from posttrain.models import build_model_from_config_dict
    from posttrain.tokenizers import load as load_tokenizer
    from posttrain.trainers.checkpoint import Checkpoint, check_checkpoint
    from posttrain.trainers.run_dir import checkpoint_state, read_json_file

    p = Path(directory)
    state = checkpoint_state(p)
    check_checkpoint(p, state, expect_trainer=expect_trainer)
    model = build_model_from_config_dict(read_json_file(p / "config.json"))
    rng = torch.load(p / "rng.pt", weights_only=True) if (p / "rng.pt").is_file() else None
    return Checkpoint(path=p, model=model, tokenizer=load_tokenizer(p / "tokenizer.json"), state=state, rng_state=rng)


def full_model_state(model) -> dict:
    """The whole model's weights on rank 0 (CPU), gathered from the shards; empty on the other ranks."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def plain_copy(model, full_state: dict) -> torch.nn.Module:
    """An unsharded model of the same config holding ``full_state`` (what ``model/`` and evaluation tools read)."""
    from posttrain.models import build_model_from_config_dict, model_config_dict

    out = build_model_from_config_dict(model_config_dict(model))
    out.load_state_dict(full_state)
    return out


def consolidate(directory: str | Path, out: str | Path) -> Path:
    """A sharded checkpoint -> a plain one (``model.safetensors``, tokenizer, state; no optimiser), one process."""
    import torch.distributed.checkpoint as dcp

    from posttrain.models import build_model_from_config_dict
    from posttrain.tokenizers import load as load_tokenizer
    from posttrain.trainers.checkpoint import save_checkpoint

    src = Path(directory)
    if not (src / DCP_DIR).is_dir():
        raise UserError(f"{src} has no {DCP_DIR}/: not a sharded (--fsdp) checkpoint")
    model = build_model_from_config_dict(json.loads((src / "config.json").read_text()))
    sd = {"model": model.state_dict()}
    with _single_process_ok():
        dcp.load(sd, checkpoint_id=str(src / DCP_DIR), no_dist=True)
    model.load_state_dict(sd["model"])
    state = json.loads((src / "trainer_state.json").read_text())
    state = {k: v for k, v in state.items() if k not in ("sharded", "world_size")}
    return save_checkpoint(
        out,
        model=model,
        tokenizer=load_tokenizer(src / "tokenizer.json"),
        state={**state, "consolidated_from": str(src)},
    )
