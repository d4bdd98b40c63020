"""How GRPO and PPO cut one rollout batch into optimizer steps: mu epochs x minibatches x grad_accum micro-batches.

Key insight: the cut is made on the *global* batch, so N processes take 1's optimizer steps. Each epoch orders the
global rows (a (seed, step, epoch) permutation when the batch is split: ``streams.epoch_order``), cuts the order into
``minibatches`` as equal as possible (one optimizer step each), and each rank runs its own rows of each minibatch
in ``grad_accum`` micro-batches (rank r holds rows [offset, offset + n) of the global batch):

    order [5, 0, 3, 1, 4, 2], minibatches 2, grad_accum 2, one process -> [[[5, 0], [3]], [[1, 4], [2]]]
    the same on rank 1 of 2 (rows 3..5: offset 3, n 3)                 -> [[[2], [0]], [[1]]]  (local rows)

Under FSDP every rank runs exactly ``grad_accum`` micro-batches per minibatch, a missing one as a dummy of weight 0
(``sharded.fixed_micro_batches``: each FSDP forward and backward is a collective).
:func:`backward_minibatch` runs one minibatch's micro-batches: each loss backward, the gradients accumulating
(FSDP reduces them over ranks on the last micro-batch only). Not handled: minibatches of a fixed token budget (the
rows are cut by count).
"""

from __future__ import annotations

import contextlib

import torch

from posttrain.trainers import distributed, sharded


def micro_schedule(order: torch.Tensor, minibatches: int, grad_accum: int, offset: int, n: int, fsdp: bool = False):
    """Every global minibatch of ``order`` as this rank's micro-batches, each (local rows, dummy):
    [[(rows, dummy), ...] per minibatch]. A minibatch where this rank has no row is ``[]`` (without FSDP): the rank
    still takes part in its all-reduces."""
    out = []
    for split in (s for s in torch.tensor_split(order, minibatches) if len(s)):
        rows = split[(split >= offset) & (split < offset + n)] - offset  # this rank's rows, local indices
        if fsdp:
            out.append(sharded.fixed_micro_batches(rows, grad_accum))
        else:
            out.append([(m, False) for m in torch.tensor_split(rows, grad_accum) if len(m)])
    return out


def real_rows(minibatch: list[tuple]) -> torch.Tensor | None:
    """This rank's rows of one minibatch (its micro-batches' rows less the dummies, in order), or None: it has none."""
    real = [rows for rows, dummy in minibatch if not dummy]
    return torch.cat(real) if real else None


def backward_minibatch(minibatch: list[tuple], loss_fn, modules: list, world, fsdp: bool) -> list[dict]:
    """``loss_fn(rows, k) -> (loss, metrics)`` over micro-batch k of ``minibatch``, each loss backward into the
    gradients of ``modules`` -> the real micro-batches' metrics. A dummy's loss is weighted 0; under FSDP (which
    averages over ranks) a real one by the world size, so the ranks' shares sum to the global minibatch's loss."""
    parts = []
    for k, (rows, dummy) in enumerate(minibatch):
        last = k == len(minibatch) - 1  # FSDP reduces the gradients on the last micro-batch only
        with contextlib.ExitStack() as stack:
            for m in modules:
                stack.enter_context(sharded.no_sync(m, last))
            loss, met = loss_fn(rows, k)
            if dummy or fsdp:
                loss = loss * (0.0 if dummy else distributed.ddp_loss_scale(world))
            loss.backward()
        if not dummy:
            parts.append(met)
    return parts
