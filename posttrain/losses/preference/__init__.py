"""Preference losses: the DPO family, as pure tensor functions (the reward-model losses are :mod:`ranking`).

Key insight: humans compare more consistently than they score, so preferences are modelled as
Bradley-Terry, P(y_w > y_l) = sigma(r_w - r_l). A reward model learns r directly (:mod:`ranking`). DPO instead uses the
closed-form optimum of the KL-regularised RLHF objective, r(x, y) = beta * log(pi(y|x) / pi_ref(y|x)) +
beta * log Z(x); the log Z(x) term cancels in r_w - r_l, so with the implicit reward

    h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))
    L_DPO = -log sigma(beta * h)            grad = -beta * sigma(-beta * h) * grad(log pi(y_w) - log pi(y_l))

alignment becomes a classification loss over (chosen, rejected) pairs. Every variant below changes only
how ``h`` is formed (length terms, no reference, adaptive beta) or the function applied to it.

Inputs are per-sequence log-probs (B,), i.e. ``sequence_logps`` of the completion tokens (prompt and
padding masked out; see ``posttrain.losses.logprobs``). Every loss is keyword-only and returns
``(loss, metrics)``: ``loss`` is a scalar mean over the batch, ``metrics`` a dict of detached 0-d tensors
(``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``, ``rewards/accuracies``, ``logps/chosen``,
``logps/rejected`` plus per-type extras). The DPO family is gathered in :data:`PREFERENCE_LOSSES`;
trainers choose a loss from that dict, never by ``if/elif``.

Not handled here: computing log-probs from a model, gradient accumulation across micro-batches, and
the distributed all-gather that beta-DPO's batch statistics would need on several ranks.
"""

from posttrain.losses.preference.base import check_same_shape
from posttrain.losses.preference.beta_dpo import BetaDPOState, beta_dpo_filter, beta_dpo_loss, beta_dpo_update_state
from posttrain.losses.preference.kto import kto_loss
from posttrain.losses.preference.length import rdpo_loss, rpo_loss, simpo_loss
from posttrain.losses.preference.margin import conservative_dpo_loss, dpo_loss, hinge_loss, ipo_loss, robust_dpo_loss

__all__ = [
    "PREFERENCE_LOSSES", "REFERENCE_FREE_LOSSES", "UNPAIRED_LOSSES", "LOSS_EXTRAS", "BetaDPOState", "beta_dpo_filter",
    "beta_dpo_loss", "beta_dpo_update_state", "check_same_shape", "conservative_dpo_loss", "dpo_loss", "hinge_loss",
    "ipo_loss", "kto_loss", "rdpo_loss", "robust_dpo_loss", "rpo_loss", "simpo_loss",
]

PREFERENCE_LOSSES = {
    "dpo": dpo_loss,
    "ipo": ipo_loss,
    "hinge": hinge_loss,
    "robust": robust_dpo_loss,
    "cdpo": conservative_dpo_loss,
    "kto": kto_loss,
    "simpo": simpo_loss,
    "rpo": rpo_loss,
    "rdpo": rdpo_loss,
    "beta_dpo": beta_dpo_loss,
}
"""Loss name -> function. Paired losses take ``policy_/ref_ chosen/rejected _logps`` and ``beta``;
their extras are keyword arguments (see :data:`LOSS_EXTRAS`). ``kto`` is unpaired."""

REFERENCE_FREE_LOSSES = frozenset({"simpo"})
"""Losses that need no reference model (the trainer can skip the reference forward pass)."""

UNPAIRED_LOSSES = frozenset({"kto"})
"""Losses that take unpaired, labelled completions instead of (chosen, rejected) pairs."""

LOSS_EXTRAS = {
    "ipo": ("chosen_lengths", "rejected_lengths"),
    "simpo": ("chosen_lengths", "rejected_lengths"),
    "rdpo": ("chosen_lengths", "rejected_lengths"),
    "rpo": ("chosen_nll",),
}
"""Per-sequence tensors a loss needs beyond the log-probs (the trainer computes them from the batch)."""
