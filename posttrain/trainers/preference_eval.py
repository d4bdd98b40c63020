"""Held-out preference metrics of a DPO-family policy, as TRL's ``DPOTrainer.evaluate`` reports them.

On held-out (prompt, chosen, rejected) pairs (``--eval-data pairs.jsonl``, or the slice of ``--data`` held out
when no ``--eval-data`` is given) the run's own loss is computed with the policy in eval mode and no gradient, and
logged under TRL's names: ``eval_loss`` and ``eval_`` + each metric the loss reports (``eval_rewards/accuracies``,
``eval_rewards/margins``, ``eval_rewards/chosen``, ``eval_logps/chosen``, ...). TensorBoard and W&B show them as
``eval/loss``, ``eval/rewards/accuracies`` (:func:`posttrain.loggers.trl_name`).

The loss is evaluated once over all held-out pairs (log-probs computed ``batch`` pairs at a time), so a loss that
couples a batch (sorting, batch statistics) sees the whole set as one batch; a stateful loss reads its current
state without updating it, and a sampling one draws from its own fixed-seed generator (the training stream is not
touched). Reference log-probs of the held-out pairs are computed once at setup where the run precomputes them.

Not handled: KTO (unpaired) held-out metrics; generation-based accuracy is the trainer's other evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.data.io import iter_records


def is_pairs_file(path: str) -> bool:
    """Whether the first record of a JSONL/Parquet file is a preference pair (has ``chosen`` and ``rejected``)."""
    first = next(iter(iter_records(path, on_bad_line="error")), None)
    return first is not None and isinstance(first[1], dict) and {"chosen", "rejected"} <= set(first[1])


@dataclass
class PairEval:
    """Held-out pairs (a ``PairedData``) and their reference log-probs (N, 2), when precomputed."""

    data: object
    ref_table: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.data.examples)


@torch.no_grad()
def pair_eval_metrics(pe: PairEval, *, policy, ref_model, choice, beta: float, loss_kwargs: dict, state=None,
                      seed: int = 0, batch: int = 32) -> dict[str, float]:  # fmt: skip
    """``{"eval_loss": L, "eval_rewards/accuracies": ..., ...}`` of ``policy`` on the held-out pairs of ``pe``.

    ``choice`` is the run's resolved loss (:func:`posttrain.losses.preference.resolve_loss`); ``ref_model`` is used
    where ``pe.ref_table`` is None and the loss needs a reference.
    """
    was_training = policy.training
    policy.eval()
    try:
        parts: list[dict] = []
        n = len(pe)
        for s in range(0, n, batch):
            idx = list(range(s, min(s + batch, n)))
            rows = pe.ref_table[idx] if pe.ref_table is not None else None
            parts.append(pe.data.loss_inputs(policy, ref_model, pe.data.collate(idx), rows))
    finally:
        policy.train(was_training)
    kw = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    if choice.state_type is not None:
        kw["state"] = state
    if choice.generator:
        kw["generator"] = torch.Generator().manual_seed(seed)
    loss, metrics = choice.fn(**kw, beta=beta, **loss_kwargs)
    return {"eval_loss": float(loss), **{f"eval_{k}": float(v) for k, v in metrics.items()}}
