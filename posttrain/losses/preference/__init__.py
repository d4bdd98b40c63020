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
``logps/rejected`` plus per-type extras). The DPO family is gathered in :data:`PREFERENCE_LOSSES`, keyed by
TRL's names where TRL has the loss (its ``DPOConfig.loss_type``, and its ``f_divergence_type`` names for the
f-DPO losses); trainers choose a loss from that dict, never by ``if/elif``. Several losses combine into a
weighted sum (``"dpo,bco_pair,sft"`` with weights, TRL's MPO) through :func:`resolve_loss`.

One module per family: ``margin`` (functions of the margin h: dpo, ipo, hinge, cdpo, robust, sigmoid_norm,
exo_pair, discopop), ``fdiv`` (f-DPO: forward KL, Jensen-Shannon, alpha), ``anchored`` (each completion's
reward on its own: nca_pair, bco_pair, sppo_hard, apo_zero, apo_down), ``aot`` (sorted, distributional),
``length`` (simpo, rdpo, rpo, sft), ``beta_dpo``, ``kto``, ``combine``.

Not handled here: computing log-probs from a model, gradient accumulation across micro-batches, and
the distributed all-gather that beta-DPO's batch statistics would need on several ranks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from posttrain.errors import ConfigError
from posttrain.losses.preference.anchored import (
    BCOState,
    apo_down_loss,
    apo_zero_loss,
    bco_pair_loss,
    bco_update_state,
    nca_pair_loss,
    sppo_hard_loss,
)
from posttrain.losses.preference.aot import aot_loss, aot_unpaired_loss
from posttrain.losses.preference.base import check_same_shape
from posttrain.losses.preference.beta_dpo import BetaDPOState, beta_dpo_filter, beta_dpo_loss, beta_dpo_update_state
from posttrain.losses.preference.combine import combined_loss
from posttrain.losses.preference.fdiv import F_DIVERGENCES, alpha_dpo_loss, f_dpo_loss, forward_kl_dpo_loss, js_dpo_loss
from posttrain.losses.preference.kto import kto_loss
from posttrain.losses.preference.length import rdpo_loss, rpo_loss, sft_loss, simpo_loss
from posttrain.losses.preference.margin import (
    conservative_dpo_loss,
    discopop_loss,
    dpo_loss,
    exo_pair_loss,
    hinge_loss,
    ipo_loss,
    robust_dpo_loss,
    sigmoid_norm_loss,
)

__all__ = [
    "PREFERENCE_LOSSES", "REFERENCE_FREE_LOSSES", "UNPAIRED_LOSSES", "LOSS_EXTRAS", "LOSS_STATES", "TRL_LOSS_TYPES",
    "F_DIVERGENCES", "LossChoice", "resolve_loss", "parse_loss_weights", "combined_loss",
    "BetaDPOState", "BCOState", "beta_dpo_filter", "beta_dpo_loss", "beta_dpo_update_state", "bco_update_state",
    "check_same_shape", "conservative_dpo_loss", "dpo_loss", "hinge_loss", "ipo_loss", "kto_loss", "rdpo_loss",
    "robust_dpo_loss", "rpo_loss", "simpo_loss", "sigmoid_norm_loss", "exo_pair_loss", "discopop_loss",
    "nca_pair_loss", "bco_pair_loss", "sppo_hard_loss", "apo_zero_loss", "apo_down_loss", "aot_loss",
    "aot_unpaired_loss", "sft_loss", "f_dpo_loss", "forward_kl_dpo_loss", "js_dpo_loss", "alpha_dpo_loss",
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
    "sigmoid_norm": sigmoid_norm_loss,
    "exo_pair": exo_pair_loss,
    "discopop": discopop_loss,
    "nca_pair": nca_pair_loss,
    "bco_pair": bco_pair_loss,
    "sppo_hard": sppo_hard_loss,
    "apo_zero": apo_zero_loss,
    "apo_down": apo_down_loss,
    "aot": aot_loss,
    "aot_unpaired": aot_unpaired_loss,
    "sft": sft_loss,
    "forward_kl": forward_kl_dpo_loss,
    "js_divergence": js_dpo_loss,
    "alpha_divergence": alpha_dpo_loss,
}
"""Loss name -> function. Paired losses take ``policy_/ref_ chosen/rejected _logps`` and ``beta``;
their extras are keyword arguments (see :data:`LOSS_EXTRAS`). ``kto`` is unpaired."""

TRL_LOSS_TYPES = {
    "dpo": "sigmoid", "ipo": "ipo", "hinge": "hinge", "robust": "robust", "sigmoid_norm": "sigmoid_norm",
    "exo_pair": "exo_pair", "discopop": "discopop", "nca_pair": "nca_pair", "bco_pair": "bco_pair",
    "sppo_hard": "sppo_hard", "apo_zero": "apo_zero", "apo_down": "apo_down", "aot": "aot",
    "aot_unpaired": "aot_unpaired", "sft": "sft", "rpo": "sigmoid,sft", "kto": "KTOTrainer kto",
    "simpo": "CPOTrainer simpo", "cdpo": "CPOTrainer sigmoid", "forward_kl": "sigmoid + f_divergence_type=forward_kl",
    "js_divergence": "sigmoid + f_divergence_type=js_divergence",
    "alpha_divergence": "sigmoid + f_divergence_type=alpha_divergence",
}
"""Our name -> how TRL 1.16 spells the same loss (``DPOConfig.loss_type`` unless another trainer is named)."""

REFERENCE_FREE_LOSSES = frozenset({"simpo", "sft"})
"""Losses that need no reference model (the trainer can skip the reference forward pass)."""

UNPAIRED_LOSSES = frozenset({"kto"})
"""Losses that take unpaired, labelled completions instead of (chosen, rejected) pairs."""

LOSS_EXTRAS = {
    "ipo": ("chosen_lengths", "rejected_lengths"),
    "simpo": ("chosen_lengths", "rejected_lengths"),
    "rdpo": ("chosen_lengths", "rejected_lengths"),
    "sigmoid_norm": ("chosen_lengths", "rejected_lengths"),
    "sft": ("chosen_lengths", "rejected_lengths"),
    "rpo": ("chosen_nll",),
}
"""Per-sequence tensors a loss needs beyond the log-probs (the trainer computes them from the batch)."""

LOSS_STATES = {"beta_dpo": BetaDPOState, "bco_pair": BCOState}
"""Losses that carry state between steps (passed as ``state=``, read back with ``State.from_metrics``)."""


class LossChoice(NamedTuple):
    """What a trainer needs to know about the loss it was asked for (one name, or several combined)."""

    name: str  # as given, e.g. "dpo" or "dpo,bco_pair,sft"
    fn: Callable  # the loss (a combined_loss for several names)
    components: tuple[str, ...]
    weights: tuple[float, ...]
    extras: tuple[str, ...]  # union of the components' LOSS_EXTRAS, in order
    reference_free: bool  # every component is
    unpaired: bool
    state_type: type | None  # the one stateful component's state class


def parse_loss_weights(weights, n: int) -> tuple[float, ...]:
    """``None`` -> n ones; "0.8,0.2,1.0" or a sequence -> floats, one per loss, each finite and >= 0.

    Example: ``parse_loss_weights("0.8, 0.2,1", 3)`` -> (0.8, 0.2, 1.0).
    """
    if weights is None:
        return (1.0,) * n
    items = [w.strip() for w in weights.split(",")] if isinstance(weights, str) else list(weights)
    try:
        out = tuple(float(w) for w in items)
    except (TypeError, ValueError):
        raise ConfigError(f"loss_weights={weights!r}: not a comma-separated list of numbers") from None
    if len(out) != n:
        raise ConfigError(f"loss_weights={weights!r} has {len(out)} weights for {n} loss(es)")
    if not all(math.isfinite(w) and w >= 0 for w in out):
        raise ConfigError(f"loss_weights={weights!r}: each weight must be a finite number >= 0")
    return out


def resolve_loss(spec: str, weights=None) -> LossChoice:
    """The loss named by ``spec``: a key of :data:`PREFERENCE_LOSSES`, or several joined by commas (weighted sum).

    ConfigError for an unknown or repeated name, a weight count that does not match, KTO in a
    combination, or two stateful components. Example: ``resolve_loss("dpo,sft", "1,0.5").extras`` ->
    ("chosen_lengths", "rejected_lengths").
    """
    names = tuple(n.strip() for n in str(spec).split(","))
    for n in names:
        if n not in PREFERENCE_LOSSES:
            raise ConfigError(f"loss={n!r} is not valid; choose one of: {', '.join(PREFERENCE_LOSSES)} "
                              "(or several joined by commas)")
    if len(set(names)) != len(names):
        raise ConfigError(f"loss={spec!r} names a loss twice")
    w = parse_loss_weights(weights, len(names))
    if len(names) > 1 and UNPAIRED_LOSSES & set(names):
        raise ConfigError(f"loss={spec!r}: {', '.join(sorted(UNPAIRED_LOSSES & set(names)))} is unpaired and cannot be "
                          "combined with other losses")
    stateful = [n for n in names if n in LOSS_STATES]
    if len(stateful) > 1:
        raise ConfigError(f"loss={spec!r}: at most one stateful loss per combination (got {', '.join(stateful)})")
    extras = tuple(dict.fromkeys(e for n in names for e in LOSS_EXTRAS.get(n, ())))
    if len(names) == 1 and w == (1.0,):
        fn = PREFERENCE_LOSSES[names[0]]
    else:
        fn = combined_loss([(n, PREFERENCE_LOSSES[n], wk) for n, wk in zip(names, w)])
    return LossChoice(",".join(names), fn, names, w, extras, all(n in REFERENCE_FREE_LOSSES for n in names),
                      bool(UNPAIRED_LOSSES & set(names)), LOSS_STATES[stateful[0]] if stateful else None)
