"""Running a trainer under ``torchrun``: who am I, which rows are mine, and sums over the global batch.

Key insight: an N-process step gives the update of a 1-process step on the same global batch when every
normaliser is *global*. Each rank r takes a disjoint slice of the global batch, computes its loss as a
sum over its own tokens divided by the global token count, ``L_r = sum_{t in r} l_t / N_global``, and the
gradient all-reduce sums ``grad L_r`` over ranks. DDP *averages* gradients (divides by W), so the loss a rank
back-propagates is ``W * L_r`` (:func:`ddp_loss_scale`); then ``sum_r grad L_r = grad (sum_t l_t / N_global)``,
exactly the 1-process gradient (up to float summation order).

    rows of rank r (n rows, W ranks):   [r*n // W, (r+1)*n // W)      (contiguous, none repeated or dropped)
    N_global = all_reduce_sum(N_r)       (SUM then divide: ReduceOp.AVG is unsupported on gloo in older
                                          torch and silently a sum on some FSDP2/gloo paths, pytorch#162338)

:class:`World` is the process's place (rank, world size, local rank); outside ``torchrun`` it is the single
process (rank 0 of 1) and every helper here is the identity, so trainers call them unconditionally.
Checkpoints and logs are written by rank 0 only (``world.is_main``); all ranks read them.

Not handled: uneven global batches that leave a rank with zero rows (the helpers raise), tensor/pipeline
parallelism, elastic membership changes mid-run.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from posttrain.errors import ConfigError


@dataclass(frozen=True)
class World:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def world() -> World:
    """This process's place: from the initialised process group, else the torchrun environment, else (0, 1, 0)."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", dist.get_rank())))
    return World(
        int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
    )


def init(backend: str | None = None) -> World:
    """Join the process group ``torchrun`` set up (gloo on CPU, nccl with CUDA); a no-op for one process."""
    w = world()
    if w.distributed and not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend)
        if backend == "nccl":
            torch.cuda.set_device(w.local_rank)
        w = world()
    return w


def shard_bounds(n: int, w: World) -> tuple[int, int]:
    """Rows ``[start, end)`` of rank ``w.rank`` out of ``n``: contiguous, disjoint, covering all n.

    Example: n=10, W=4 -> (0, 2), (2, 5), (5, 7), (7, 10).
    """
    if n < w.world_size:
        raise ConfigError(f"a global batch of {n} rows cannot be split over {w.world_size} processes (each needs >= 1)")
    return w.rank * n // w.world_size, (w.rank + 1) * n // w.world_size


def shard(x, w: World):
    """This rank's contiguous slice of ``x`` (a tensor, list or range) along its first dimension."""
    a, b = shard_bounds(len(x), w)
    return x[a:b]


def all_reduce_sum(x: torch.Tensor, w: World) -> torch.Tensor:
    """Sum of ``x`` over ranks (a new tensor; ``x`` itself is left as it was). Identity for one process."""
    if not w.distributed:
        return x
    y = x.detach().clone()
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y


def global_sum(value: float | int, w: World) -> float:
    """A Python number summed over ranks (token counts, sequence counts)."""
    if not w.distributed:
        return value
    return all_reduce_sum(torch.tensor(float(value), dtype=torch.float64), w).item()


def row_offsets(n: int, w: World) -> tuple[int, int]:
    """(this rank's first row in the global batch, the global row count) when rank r holds ``n_r`` rows.
    One process: (0, n)."""
    if not w.distributed:
        return 0, n
    counts = torch.zeros(w.world_size, dtype=torch.float64)
    counts[w.rank] = n
    counts = all_reduce_sum(counts, w).long().tolist()
    return sum(counts[: w.rank]), sum(counts)


def mean_metrics(metrics: dict, w: World) -> dict:
    """Numeric metrics averaged over the ranks that report them, for logging on rank 0; other values kept as they
    are. Ranks may report different keys (a rank with no rows of a step has no loss statistics): the key sets are
    gathered first, so every rank reduces the same vector (else gloo fails on a size mismatch), and a key is the
    mean over the ranks that have it (SUM / W when all do)."""
    if not w.distributed:
        return metrics
    mine = sorted(k for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
    gathered: list = [None] * w.world_size
    dist.all_gather_object(gathered, mine)
    keys = sorted(set().union(*gathered))
    if not keys:
        return metrics
    values = torch.tensor([float(metrics[k]) if k in mine else 0.0 for k in keys], dtype=torch.float64)
    present = torch.tensor([float(k in mine) for k in keys], dtype=torch.float64)
    summed = all_reduce_sum(torch.cat([values, present]), w)
    means = summed[: len(keys)] / summed[len(keys) :]
    return {**metrics, **dict(zip(keys, means.tolist()))}


def all_reduce_grads(model: torch.nn.Module, w: World) -> None:
    """Sum every parameter's gradient over ranks in one flat buffer (a missing gradient counts as zeros): what
    DDP's reducer does, for a trainer whose forward passes the DDP wrapper cannot see (the policy-gradient
    trainer's shared-prefix scoring). With losses normalised by global counts, the sum is the 1-process gradient."""
    if not w.distributed:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p))
        offset += n


def ddp_loss_scale(w: World) -> float:
    """What a rank multiplies its globally-normalised loss by before ``backward`` under DDP (which averages)."""
    return float(w.world_size)


def wrap_ddp(model: torch.nn.Module, w: World) -> torch.nn.Module:
    """``DistributedDataParallel(model)`` on several processes, the model itself on one."""
    if not w.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    on_gpu = next(model.parameters()).is_cuda  # --device cpu on a GPU machine: a CPU model, no device_ids
    return DDP(model, device_ids=[w.local_rank] if on_gpu else None)


def no_sync(model: torch.nn.Module, last: bool):
    """Skip DDP's gradient all-reduce on every micro-batch but the ``last`` of an accumulation (a null context for
    a plain module, or on the last micro-batch)."""
    return model.no_sync() if hasattr(model, "no_sync") and not last else contextlib.nullcontext()


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP wrapper (what is saved and evaluated)."""
    return getattr(model, "module", model)


@contextlib.contextmanager
def main_first(w: World):
    """Rank 0 runs the block first (e.g. sampling data and caching it in the run directory), then the others
    (which find the cache). A plain block on one process."""
    if not w.is_main:
        barrier(w)
    yield
    if w.is_main:
        barrier(w)


def barrier(w: World) -> None:
    if w.distributed:
        dist.barrier()


def broadcast_object(obj, w: World, src: int = 0):
    """``obj`` from rank ``src`` on every rank (e.g. a run id only rank 0 generated)."""
    if not w.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model``'s parameters are FSDP2 shards (DTensors) rather than whole tensors."""
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def leave_process_group() -> None:
    """End of a torchrun job: wait for every rank, then tear the process group down.

    No rank exits (and kills gloo's threads) while another is still in a collective, and the last collectives'
    objects (FSDP keeps some in reference cycles) are freed while the process group and the interpreter are whole:
    freed later, during interpreter shutdown, they can abort the process ("terminate called without an active
    exception", SIGABRT) after the run has finished. A no-op without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    import gc

    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()
