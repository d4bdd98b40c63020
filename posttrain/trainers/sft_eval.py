"""SFT's held-out loss, TRL's ``eval_loss``: the completion-token cross-entropy of held-out demonstrations.

The held-out demonstrations are ``--eval-data`` when it is a demonstrations file (``messages`` conversations, or
``prompt``/``completion`` pairs: the same formats as ``--data``), else the slice of ``--data`` held out from
training when no ``--eval-data`` is given. They are encoded exactly as training demonstrations (the chat
template's assistant mask), and the loss is the token-weighted mean over all of them, model in eval mode:

    eval_loss = sum_{held-out tokens t} -log p(x_t | x_<t) / (number of held-out completion tokens)

It is logged beside the generation accuracy (``heldout_accuracy``); model selection never looks at it.

Not handled: a per-conversation breakdown, perplexity on raw text (no completion mask).
"""

from __future__ import annotations

import math

import torch

from posttrain.data.io import iter_records


def is_demos_file(path: str) -> bool:
    """Whether the first record of a JSONL/Parquet file is a demonstration (``messages``, or ``completion``)."""
    first = next(iter(iter_records(path, on_bad_line="error")), None)
    return first is not None and isinstance(first[1], dict) and ("messages" in first[1] or "completion" in first[1])


@torch.no_grad()
def heldout_loss(model, ids: torch.Tensor, loss_mask: torch.Tensor, loss_fn, batch: int = 64) -> float:
    """Token-weighted mean completion cross-entropy of ``ids`` (N, L) under ``loss_mask`` (N, L); ``loss_fn`` is
    the trainer's ``sft_loss(model, ids, mask, n_tokens)`` (a sum over the rows divided by ``n_tokens``)."""
    n_tok = int(loss_mask[:, 1:].sum())
    if n_tok == 0:
        return math.nan
    was_training = model.training
    model.eval()
    try:
        total = 0.0
        for s in range(0, len(ids), batch):
            m = loss_mask[s : s + batch]
            if m[:, 1:].any():
                total += float(loss_fn(model, ids[s : s + batch], m, n_tok))
    finally:
        model.train(was_training)
    return total
