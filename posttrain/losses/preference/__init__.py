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
f-DPO losses). Each loss is declared once, as a :class:`LossSpec` in :data:`LOSS_SPECS` (function, TRL name,
default beta, user options with their domains, extra inputs, reference-free, unpaired, state, sampling);
trainers read the spec, never a branch on the name or the function's signature. Several losses combine into a
weighted sum (``"dpo,bco_pair,sft"`` with weights, TRL's MPO) through :func:`resolve_loss`.

One module per family: ``margin`` (functions of the margin h: dpo, ipo, hinge, cdpo, robust, sigmoid_norm,
exo_pair, discopop), ``fdiv`` (f-DPO: forward KL, Jensen-Shannon, alpha), ``anchored`` (each completion's
reward on its own: nca_pair, bco_pair, sppo_hard, apo_zero, apo_down), ``aot`` (sorted, distributional),
``length`` (simpo, rdpo, rpo, sft), ``beta_dpo``, ``kto``, ``combine``.

Not handled here: computing log-probs from a model, gradient accumulation across micro-batches, and
the distributed all-gather that beta-DPO's batch statistics would need on several ranks.
"""

from __future__ import annotations

import difflib
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
    "LOSS_SPECS",
    "LossSpec",
    "PREFERENCE_LOSSES",
    "REFERENCE_FREE_LOSSES",
    "UNPAIRED_LOSSES",
    "LOSS_EXTRAS",
    "LOSS_STATES",
    "TRL_LOSS_TYPES",
    "LOSS_ALIASES",
    "NO_EQUIVALENT",
    "canonical_loss",
    "F_DIVERGENCES",
    "LossChoice",
    "resolve_loss",
    "parse_loss_weights",
    "combined_loss",
    "BetaDPOState",
    "BCOState",
    "beta_dpo_filter",
    "beta_dpo_loss",
    "beta_dpo_update_state",
    "bco_update_state",
    "check_same_shape",
    "conservative_dpo_loss",
    "dpo_loss",
    "hinge_loss",
    "ipo_loss",
    "kto_loss",
    "rdpo_loss",
    "robust_dpo_loss",
    "rpo_loss",
    "simpo_loss",
    "sigmoid_norm_loss",
    "exo_pair_loss",
    "discopop_loss",
    "nca_pair_loss",
    "bco_pair_loss",
    "sppo_hard_loss",
    "apo_zero_loss",
    "apo_down_loss",
    "aot_loss",
    "aot_unpaired_loss",
    "sft_loss",
    "f_dpo_loss",
    "forward_kl_dpo_loss",
    "js_dpo_loss",
    "alpha_dpo_loss",
]

LENGTHS = ("chosen_lengths", "rejected_lengths")
SMOOTHING = {"label_smoothing": {"ge": 0, "le": 0.5}}


class LossSpec(NamedTuple):
    """Everything a trainer needs to know about one loss, declared in one place (:data:`LOSS_SPECS`).

    ``options``: the keyword arguments a user may set (``loss_kwargs``), each with its domain as knob bounds
    (``{}`` = any finite number); their defaults are the function's own. ``extras``: per-sequence tensors the
    trainer computes from the batch (``chosen_lengths``, ``rejected_lengths``, ``chosen_nll``). ``state``: the
    class of the state carried between steps (passed as ``state=``). ``generator``: the loss samples (takes
    ``generator=``). ``trl``: how TRL 1.16 spells the same loss (``DPOConfig.loss_type`` unless another
    trainer is named; None where TRL has none).
    """

    fn: Callable
    trl: str | None
    default_beta: float = 0.1
    options: dict = {}
    extras: tuple[str, ...] = ()
    reference_free: bool = False
    unpaired: bool = False
    state: type | None = None
    generator: bool = False
    batch_coupled: bool = False  # not a mean of per-pair terms (batch statistics, sorting, a batch KL, a shared state)


LOSS_SPECS: dict[str, LossSpec] = {
    "dpo": LossSpec(dpo_loss, "sigmoid"),
    "ipo": LossSpec(ipo_loss, "ipo", extras=LENGTHS),
    "hinge": LossSpec(hinge_loss, "hinge"),
    "robust": LossSpec(robust_dpo_loss, "robust", options={"label_smoothing": {"ge": 0, "lt": 0.5}}),  # / (1 - 2 eps)
    "cdpo": LossSpec(conservative_dpo_loss, "CPOTrainer sigmoid", options=SMOOTHING),
    "kto": LossSpec(
        kto_loss,
        "KTOTrainer kto",
        unpaired=True,
        batch_coupled=True,
        options={"desirable_weight": {"ge": 0}, "undesirable_weight": {"ge": 0}},
    ),
    "simpo": LossSpec(
        simpo_loss,
        "CPOTrainer simpo",
        default_beta=2.0,
        extras=LENGTHS,
        reference_free=True,
        options={"gamma": {}, **SMOOTHING},
    ),
    "rpo": LossSpec(rpo_loss, "sigmoid,sft", options={"alpha": {"ge": 0}}, extras=("chosen_nll",)),
    "rdpo": LossSpec(rdpo_loss, None, options={"alpha": {}}, extras=LENGTHS),
    "beta_dpo": LossSpec(
        beta_dpo_loss,
        None,
        state=BetaDPOState,
        generator=True,
        batch_coupled=True,
        options={
            "alpha": {"ge": 0},
            "filter_ratio": {"ge": 0, "lt": 1},
            "momentum": {"ge": 0, "lt": 1},
            "min_beta": {"gt": 0},
        },
    ),
    "sigmoid_norm": LossSpec(sigmoid_norm_loss, "sigmoid_norm", extras=LENGTHS),
    "exo_pair": LossSpec(
        exo_pair_loss, "exo_pair", options={"label_smoothing": {"gt": 0, "lt": 1}}
    ),  # log eps, log(1-eps)
    "discopop": LossSpec(discopop_loss, "discopop", options={"tau": {"gt": 0}}),
    "nca_pair": LossSpec(nca_pair_loss, "nca_pair"),
    "bco_pair": LossSpec(
        bco_pair_loss, "bco_pair", state=BCOState, batch_coupled=True, options={"reward_shift": {"ge": 0, "le": 1}}
    ),
    "sppo_hard": LossSpec(sppo_hard_loss, "sppo_hard"),
    "apo_zero": LossSpec(apo_zero_loss, "apo_zero"),
    "apo_down": LossSpec(apo_down_loss, "apo_down"),
    "aot": LossSpec(aot_loss, "aot", options=SMOOTHING, batch_coupled=True),
    "aot_unpaired": LossSpec(aot_unpaired_loss, "aot_unpaired", options=SMOOTHING, batch_coupled=True),
    "sft": LossSpec(sft_loss, "sft", extras=LENGTHS, reference_free=True, batch_coupled=True),  # a token mean
    "forward_kl": LossSpec(forward_kl_dpo_loss, "sigmoid + f_divergence_type=forward_kl"),
    "js_divergence": LossSpec(js_dpo_loss, "sigmoid + f_divergence_type=js_divergence"),
    "alpha_divergence": LossSpec(alpha_dpo_loss, "sigmoid + f_divergence_type=alpha_divergence", options={"alpha": {}}),
}
"""Loss name (TRL's where TRL has the loss) -> its one spec. Paired losses take ``policy_/ref_ chosen/rejected
_logps`` and ``beta``; ``kto`` takes labelled single completions. The tables below are views of this one."""

PREFERENCE_LOSSES = {name: spec.fn for name, spec in LOSS_SPECS.items()}
"""Loss name -> function (a view of :data:`LOSS_SPECS`)."""
TRL_LOSS_TYPES = {name: spec.trl for name, spec in LOSS_SPECS.items() if spec.trl}
REFERENCE_FREE_LOSSES = frozenset(n for n, spec in LOSS_SPECS.items() if spec.reference_free)
UNPAIRED_LOSSES = frozenset(n for n, spec in LOSS_SPECS.items() if spec.unpaired)
LOSS_EXTRAS = {n: spec.extras for n, spec in LOSS_SPECS.items() if spec.extras}
LOSS_STATES = {n: spec.state for n, spec in LOSS_SPECS.items() if spec.state is not None}

LOSS_ALIASES: dict[str, str] = {
    **{spec.trl: name for name, spec in LOSS_SPECS.items() if spec.trl and "," not in spec.trl and " " not in spec.trl},
    "sigmoid": "dpo",  # TRL's DPOConfig.loss_type default
    "aot_pair": "aot_unpaired",  # TRL before 0.20: sorted chosen vs sorted rejected log-ratios
    "simpo": "simpo",  # CPOTrainer loss_type="simpo" (with cpo_alpha=0)
}
"""TRL's ``loss_type`` names (DPOTrainer, and CPOTrainer/KTOTrainer where they name the same loss) -> ours.
Every name of TRL 1.16's ``DPOConfig.loss_type`` is here; ``--loss sigmoid`` is ``--loss dpo``."""

NO_EQUIVALENT: dict[str, tuple[str, ...]] = {
    "kto_pair": ("kto", "bco_pair"),  # removed from TRL; paired KTO
    "apo_zero_unpaired": ("kto", "apo_zero"),  # KTOTrainer's unpaired APO-zero
    "alphapo": ("simpo",),  # CPOTrainer: SimPO with an alpha-shaped reward
    "orpo": ("rpo", "simpo"),  # ORPOTrainer: odds ratio + NLL, reference-free
    "cpo": ("simpo", "rpo"),  # CPOTrainer's default: sigmoid + NLL without a reference
    "bco": ("bco_pair", "kto"),  # BCOTrainer: unpaired, with a density-ratio classifier
    "dpop": ("rpo", "apo_down"),  # DPO-Positive
    "slic": ("hinge",),
}
"""Loss names from TRL and the literature that we do not implement -> the closest ones we do."""


def canonical_loss(name: str) -> str:
    """Our name for one loss name (ours, or TRL's ``loss_type``); ConfigError naming the closest ones otherwise.

    Example: ``canonical_loss("sigmoid")`` -> "dpo"; ``canonical_loss("orpo")`` raises "loss='orpo' is not
    implemented; closest: rpo, simpo".
    """
    if name in LOSS_SPECS:
        return name
    if name in LOSS_ALIASES:
        return LOSS_ALIASES[name]
    if name in NO_EQUIVALENT:
        raise ConfigError(f"loss={name!r} is not implemented; closest: {', '.join(NO_EQUIVALENT[name])}")
    close = difflib.get_close_matches(name, [*LOSS_SPECS, *LOSS_ALIASES], n=3, cutoff=0.6)
    hint = f"closest: {', '.join(dict.fromkeys(close))}; " if close else ""
    raise ConfigError(
        f"loss={name!r} is not valid; {hint}choose one of: {', '.join(PREFERENCE_LOSSES)} "
        "or a TRL loss_type (or several joined by commas)"
    )


class LossChoice(NamedTuple):
    """What a trainer needs to know about the loss it was asked for (one name, or several combined)."""

    name: str  # our names, e.g. "dpo" or "dpo,bco_pair,sft" (TRL's "sigmoid" -> "dpo")
    fn: Callable  # the loss (a combined_loss for several names)
    components: tuple[str, ...]
    weights: tuple[float, ...]
    extras: tuple[str, ...]  # union of the components' LOSS_EXTRAS, in order
    reference_free: bool  # every component is
    unpaired: bool
    state_type: type | None  # the one stateful component's state class
    generator: bool  # some component samples (takes ``generator=``)
    options: dict  # option -> {component: bounds}: what ``loss_kwargs`` may set, and each component's domain
    default_beta: float  # the first component's
    batch_coupled: bool  # some component is (see LossSpec)


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
    """The loss named by ``spec``: a key of :data:`PREFERENCE_LOSSES` or a TRL name of one (:data:`LOSS_ALIASES`), or
    several joined by commas (weighted sum). The choice's ``name`` is ours (``"sigmoid,sft"`` -> ``"dpo,sft"``).

    ConfigError for an unknown or repeated name, a weight count that does not match, KTO in a
    combination, or two stateful components. Example: ``resolve_loss("dpo,sft", "1,0.5").extras`` ->
    ("chosen_lengths", "rejected_lengths").
    """
    names = tuple(canonical_loss(n.strip()) for n in str(spec).split(","))
    if len(set(names)) != len(names):
        raise ConfigError(f"loss={spec!r} names a loss twice")
    w = parse_loss_weights(weights, len(names))
    if len(names) > 1 and UNPAIRED_LOSSES & set(names):
        raise ConfigError(
            f"loss={spec!r}: {', '.join(sorted(UNPAIRED_LOSSES & set(names)))} is unpaired and cannot be "
            "combined with other losses"
        )
    stateful = [n for n in names if n in LOSS_STATES]
    if len(stateful) > 1:
        raise ConfigError(f"loss={spec!r}: at most one stateful loss per combination (got {', '.join(stateful)})")
    extras = tuple(dict.fromkeys(e for n in names for e in LOSS_EXTRAS.get(n, ())))
    if len(names) == 1 and w == (1.0,):
        fn = PREFERENCE_LOSSES[names[0]]
    else:
        fn = combined_loss([(n, PREFERENCE_LOSSES[n], wk) for n, wk in zip(names, w)])
    specs = [LOSS_SPECS[n] for n in names]
    options: dict[str, dict] = {}
    for n, spec in zip(names, specs):
        for opt, bounds in spec.options.items():
            options.setdefault(opt, {})[n] = bounds
    return LossChoice(
        ",".join(names),
        fn,
        names,
        w,
        extras,
        all(sp.reference_free for sp in specs),
        any(sp.unpaired for sp in specs),
        LOSS_STATES[stateful[0]] if stateful else None,
        any(sp.generator for sp in specs),
        options,
        specs[0].default_beta,
        any(sp.batch_coupled for sp in specs),
    )
