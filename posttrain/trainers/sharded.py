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

Several modules (PPO's policy and critic) are saved side by side: ``parts`` names the others, each with its
optimiser under its own DCP key and its backbone's config in ``NAME_config.json``; a reward model's DCP ``model`` is
the whole RM (backbone + head) with ``trainer_state.json`` saying ``reward_model``. :func:`consolidate` writes each
in the layout its loader reads: ``model.safetensors`` (+ ``reward_head.safetensors`` for an RM, + ``NAME.safetensors``
per part).

RL rollouts under FSDP sample from a *replica*: a plain copy of the policy on every rank, refreshed from the shards
once per step (:func:`sync_replica`, every parameter all-gathered), so the sampler and the evaluation make no
collective calls and each rank may generate a different number of tokens. It costs one full copy of the
parameters per rank (no gradients, no optimiser state), as a colocated inference engine does (verl, TRL). Every
FSDP forward and backward is a collective, so in an update every rank runs the same number of micro-batches:
a micro-batch where a rank has no row runs one of its rows with weight 0 (:func:`fixed_micro_batches`).

Mixed precision (``--dtype bf16`` / ``fp16`` under ``--fsdp``): FSDP2's ``MixedPrecisionPolicy(param_dtype=compute
dtype, reduce_dtype=fp32)`` on every block and the root (:func:`mixed_precision`). The shards, the optimiser state and
the checkpoints stay fp32; each all-gather casts the shards to the compute dtype (half the bytes on the wire, and the
forward and backward compute on bf16 weights), and the gradients are cast back to fp32 before the reduce-scatter, so
the average over ranks and the update are done in fp32. The forward still runs under the run's autocast
(``engine/device.py``), which keeps softmax, normalisation and the loss in fp32 as it does unsharded; fp16's loss
scale reaches the sharded parameters as it reaches plain ones. ``--dtype fp32`` passes no policy: ``fully_shard``
is called exactly as before.

Not handled: CPU offload of parameters during training, HF models other than those
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
from posttrain.trainers.distributed import is_sharded  # noqa: F401  (imported from here too)

DCP_DIR = "dcp"


def _fully_shard():
    try:  # torch >= 2.6
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.4-2.5 kept it under _composable
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks FSDP shards one by one: posttrain GPT ``blocks``, HF ``model.layers`` or ``transformer.h``."""
    for path in (pre + p for pre in ("", "backbone.model.") for p in ("blocks", "model.layers", "transformer.h")):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, torch.nn.ModuleList):
            return list(obj)
    raise UserError(
        f"--fsdp: cannot find the transformer blocks of a {type(model).__name__} (looked for blocks, "
        f"model.layers, transformer.h, and those of a head's backbone.model)"
    )


def mixed_precision(dtype: str):
    """FSDP2's policy for the run's ``--dtype``: None for fp32 (no policy: full-precision all-gathers), else
    ``MixedPrecisionPolicy(param_dtype=<bf16|fp16>, reduce_dtype=float32)`` (compute-dtype all-gathers and forward
    weights, fp32 gradient reduce-scatter). Example: ``mixed_precision("bf16").param_dtype`` -> torch.bfloat16."""
    from posttrain.trainers.engine.device import DTYPES

    if dtype == "fp32":
        return None
    try:  # torch >= 2.6
        from torch.distributed.fsdp import MixedPrecisionPolicy
    except ImportError:  # torch 2.4-2.5
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy
    return MixedPrecisionPolicy(param_dtype=DTYPES[dtype], reduce_dtype=torch.float32)


def shard_model(model: torch.nn.Module, dtype: str = "fp32") -> torch.nn.Module:
    """``fully_shard`` each block, then the root (in place; the module keeps its class and methods), with the
    :func:`mixed_precision` policy of ``dtype`` (fp32: none, the call is the plain ``fully_shard(module)``)."""
    fully_shard = _fully_shard()
    policy = mixed_precision(dtype)
    kwargs = {} if policy is None else {"mp_policy": policy}
    for block in transformer_blocks(model):
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


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


def _config_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose ``config.json`` rebuilds ``model``: a head's (RM, critic) backbone LM, else the model."""
    inner = getattr(model, "backbone", None)
    return inner.model if inner is not None else model


def _dcp_state(model, optimizer, parts: dict | None, tensors: dict | None = None) -> dict:
    msd, osd = _state_dicts(model, optimizer, full=False)
    sd = {"model": msd, "optim": osd}
    for name, (module, opt) in (parts or {}).items():
        sd[name], sd[f"{name}_optim"] = _state_dicts(module, opt, full=False)
    return {**sd, **(tensors or {})}


def save_sharded_checkpoint(
    directory: str | Path,
    model,
    optimizer,
    tokenizer,
    state: dict,
    rng_state: dict | None,
    w: distributed.World,
    parts: dict | None = None,
    tensors: dict | None = None,
) -> Path:
    """Every rank writes its shards; rank 0 the rest; the directory replaces an older one by one rename.
    ``parts``: {name: (module, optimizer)} saved beside the model (PPO's critic), each rebuilt from ``NAME_config.json``.
    ``tensors``: {name: {key: tensor}} more (sharded) tensors in the DCP, read back by :func:`load_sharded_tensors`."""
    import torch.distributed.checkpoint as dcp

    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp-sharded")
    if w.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    distributed.barrier(w)
    dcp.save(_dcp_state(model, optimizer, parts, tensors), checkpoint_id=str(tmp / DCP_DIR))
    if w.is_main:
        from posttrain.models import model_config_dict

        (tmp / "config.json").write_text(json.dumps(model_config_dict(_config_module(model)), indent=2) + "\n")
        for name, (module, _) in (parts or {}).items():
            cfg = model_config_dict(_config_module(module))
            (tmp / f"{name}_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
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


def load_sharded_checkpoint(directory: str | Path, model, optimizer, parts: dict | None = None) -> None:
    """Load a DCP checkpoint (saved at any world size) into ``model`` and its ``optimizer`` (and each of ``parts``,
    {name: (module, optimizer)}): sharded (FSDP, any number of processes) or plain (one process, no process group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    p = Path(directory) / DCP_DIR
    if not p.is_dir():
        raise UserError(f"{directory} has no {DCP_DIR}/: not a sharded (--fsdp) checkpoint")
    sd = _dcp_state(model, optimizer, parts)
    with _single_process_ok():
        dcp.load(sd, checkpoint_id=str(p), no_dist=not dist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    for name, (module, opt) in (parts or {}).items():
        set_state_dict(module, opt, model_state_dict=sd[name], optim_state_dict=sd[f"{name}_optim"])


def load_sharded_tensors(directory: str | Path, templates: dict) -> None:
    """Fill ``templates`` ({name: {key: tensor}}, sharded like the ones saved or plain in one process) in place from
    the ``tensors`` a sharded checkpoint was saved with (DCP reshards: any world size)."""
    import torch.distributed.checkpoint as dcp

    with _single_process_ok():
        dcp.load(templates, checkpoint_id=str(Path(directory) / DCP_DIR), no_dist=not dist.is_initialized())


def read_sharded_checkpoint(directory: str | Path, expect_trainer: str):
    """A sharded checkpoint's model (built from ``config.json``, weights not yet loaded: they come with the
    optimiser in :func:`load_sharded_checkpoint`), tokenizer, state and RNG, as a ``Checkpoint``."""
    from posttrain.checkpoints.files import load_torch_state, reading
    from posttrain.checkpoints.layout import checkpoint_state, read_json_file
    from posttrain.checkpoints.load import Checkpoint, check_checkpoint
    from posttrain.models import build_model_from_config_dict
    from posttrain.tokenizers import load as load_tokenizer

    p = Path(directory)
    state = checkpoint_state(p)
    check_checkpoint(p, state, expect_trainer=expect_trainer)
    model = build_model_from_config_dict(read_json_file(p / "config.json"))
    rng = load_torch_state(p / "rng.pt") if (p / "rng.pt").is_file() else None  # corrupt: one line naming it
    with reading(p / "tokenizer.json"):
        tokenizer = load_tokenizer(p / "tokenizer.json")
    return Checkpoint(path=p, model=model, tokenizer=tokenizer, state=state, rng_state=rng)


def full_model_state(model) -> dict:
    """The whole model's weights on rank 0 (CPU), gathered from the shards; empty on the other ranks."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _rebuild(config: dict, like: str | None) -> torch.nn.Module:
    """A fresh module from a saved config: the LM itself, or a reward model / value model around it (``like``)."""
    from posttrain.models import build_model_from_config_dict
    from posttrain.models.heads import RewardModel
    from posttrain.models.value import ValueModel

    base = build_model_from_config_dict(config)
    return {"reward": RewardModel, "value": ValueModel}[like](base) if like else base


def _kind(model) -> str | None:
    from posttrain.models.heads import RewardModel
    from posttrain.models.value import ValueModel

    return "reward" if isinstance(model, RewardModel) else "value" if isinstance(model, ValueModel) else None


def plain_copy(model, full_state: dict) -> torch.nn.Module:
    """An unsharded model of the same config (an LM, a reward model or a value model) holding ``full_state``
    (what ``model/`` and evaluation tools read)."""
    from posttrain.models import model_config_dict

    out = _rebuild(model_config_dict(_config_module(model)), _kind(model))
    out.load_state_dict(full_state)
    return out


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole on *every* rank (each all-gathered from its shards, in one fixed order)."""
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach() for n, p in model.named_parameters()}


def rollout_replica(model: torch.nn.Module) -> torch.nn.Module:
    """A plain, frozen copy of ``model`` to sample from under FSDP (made before sharding; :func:`sync_replica`
    refreshes it)."""
    import copy

    replica = copy.deepcopy(model)
    for p in replica.parameters():
        p.requires_grad_(False)
    return replica


def sync_replica(replica: torch.nn.Module | None, model: torch.nn.Module) -> None:
    """Copy the trainer's current (sharded) weights into its rollout replica; a collective, once per step on every
    rank (never inside sampling, whose length differs per rank). Nothing to do without a replica."""
    if replica is None:
        return
    own = dict(replica.named_parameters())
    with torch.no_grad():
        for n, p in model.named_parameters():  # one parameter gathered at a time (no second whole copy)
            own[n].copy_(p.full_tensor() if hasattr(p, "full_tensor") else p)


def fixed_micro_batches(rows: torch.Tensor, grad_accum: int) -> list[tuple[torch.Tensor, bool]]:
    """``rows`` (this rank's rows of a global minibatch) cut into exactly ``grad_accum`` micro-batches, each as
    (rows, dummy): an empty one becomes row 0 with ``dummy`` True, whose loss the trainer weights by 0, so every
    rank runs the same FSDP forwards and backwards (each is a collective). Example: rows [4, 7], grad_accum 3 ->
    [([4], False), ([7], False), ([0], True)]."""
    return [
        (m, False) if len(m) else (torch.zeros(1, dtype=torch.long), True) for m in torch.tensor_split(rows, grad_accum)
    ]


def consolidate(directory: str | Path, out: str | Path) -> Path:
    """A sharded checkpoint -> a plain one (no optimiser), one process: ``model.safetensors``, tokenizer, state; a
    reward model's head as ``reward_head.safetensors`` (and its ``reward_stats.json`` when saved), and each part
    (PPO's critic) as ``NAME.safetensors``: what ``load_checkpoint`` / ``load_reward_model`` / PPO read."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    from posttrain.checkpoints.layout import REWARD_HEAD_FILE, read_json_file
    from posttrain.models.heads import REWARD_STATS_FILE
    from posttrain.tokenizers import load as load_tokenizer
    from posttrain.trainers.checkpoint import save_with_extras

    src = Path(directory)
    if not (src / DCP_DIR).is_dir():
        raise UserError(f"{src} has no {DCP_DIR}/: not a sharded (--fsdp) checkpoint")
    state = read_json_file(src / "trainer_state.json")
    state = {k: v for k, v in state.items() if k not in ("sharded", "world_size")}
    root = _rebuild(read_json_file(src / "config.json"), "reward" if state.get("reward_model") else None)
    parts = {
        f.name[: -len("_config.json")]: _rebuild(read_json_file(f), "value") for f in sorted(src.glob("*_config.json"))
    }
    sd = {"model": root.state_dict(), **{name: m.state_dict() for name, m in parts.items()}}
    with _single_process_ok():
        dcp.load(sd, checkpoint_id=str(src / DCP_DIR), no_dist=True)
    root.load_state_dict(sd["model"])

    def extras(tmp: Path) -> None:
        if state.get("reward_model"):
            save_file({k: v.contiguous() for k, v in root.head.state_dict().items()}, str(tmp / REWARD_HEAD_FILE))
            if (src / REWARD_STATS_FILE).is_file():
                shutil.copyfile(src / REWARD_STATS_FILE, tmp / REWARD_STATS_FILE)
        for name, m in parts.items():
            m.load_state_dict(sd[name])
            own = {k: v.detach().clone().contiguous() for k, v in m.state_dict().items()}  # tied weights: each a copy
            save_file(own, str(tmp / f"{name}.safetensors"))

    return save_with_extras(
        out,
        extras,
        model=_config_module(root),
        tokenizer=load_tokenizer(src / "tokenizer.json"),
        state={**state, "consolidated_from": str(src)},
    )


def save_periodic(
    manager, done: int, model, optimizer, tokenizer, state: dict, rng, w, parts=None, tensors=None
) -> None:
    """A trainer's periodic sharded checkpoint ``step-N`` (every rank), then ``checkpoints/latest`` and pruning
    through its ``CheckpointManager`` (rank 0), as for a plain checkpoint."""
    directory = manager.root / f"step-{done:08d}"
    save_sharded_checkpoint(directory, model, optimizer, tokenizer, state, rng, w, parts, tensors)
    if w.is_main:
        manager.save(done, save_fn=lambda d, **kw: d)


def published(model: torch.nn.Module, w) -> torch.nn.Module:
    """What ``model/`` holds: a sharded model gathered whole into a plain copy on rank 0 (a collective: every rank
    calls it; the others get ``model`` back); an unsharded model itself."""
    if not is_sharded(model):
        return model
    full = full_model_state(model)
    return plain_copy(model, full) if w.is_main else model
