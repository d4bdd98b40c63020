"""Losses on each completion's own implicit reward r = beta * log pi/pi_ref, not only on the margin r_w - r_l.

DPO's loss depends on r_w - r_l alone, so both log-probs may fall while the margin grows. These losses
anchor the chosen and the rejected reward separately (to 0, or to a running shift):

    nca_pair   -log sigma(r_w) - 1/2 log sigma(-r_w) - 1/2 log sigma(-r_l)          (NCA, Chen et al. 2024)
    bco_pair   -log sigma(r_w - delta) - log sigma(-(r_l - delta)), delta a running mean reward   (BCO, Jung et al. 2024)
    sppo_hard  (lr_w - 1/(2 beta))^2 + (lr_l + 1/(2 beta))^2                        (SPPO, Wu et al. 2024)
    apo_zero   (1 - sigma(r_w)) + sigma(r_l)                                        (APO, D'Oosterlinck et al. 2024)
    apo_down   sigma(r_w) + (1 - sigma(r_w - r_l))

The rewards are those of the reverse KL (TRL rejects f-divergences for these). BCO's shift is the loss's
state (:class:`BCOState`), passed in and returned through ``metrics`` like beta-DPO's.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from posttrain.losses.preference.base import Tensor, _check_beta, _logratios, _pair_metrics


def _rewards(beta, policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps):
    _check_beta(beta)
    chosen_lr, rejected_lr = _logratios(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    return chosen_lr, rejected_lr, beta * chosen_lr, beta * rejected_lr


def nca_pair_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """NCA: L = -log sigma(r_w) - 0.5 log sigma(-r_w) - 0.5 log sigma(-r_l), r = beta lr  (Chen et al. 2024, pairwise NCA).

    "Noise Contrastive Alignment of Language Models with Explicit Rewards": the pairwise form of NCA
    raises the chosen reward in absolute terms (not only relative to the rejected one), so the chosen
    likelihood does not decrease the way it can under DPO.
    Example: all rewards 0 -> log 2 + 0.5 log 2 + 0.5 log 2 = 2 log 2 = 1.3863.
    """
    lr_w, lr_l, r_w, r_l = _rewards(
        beta, policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    losses = -F.logsigmoid(r_w) - 0.5 * F.logsigmoid(-r_w) - 0.5 * F.logsigmoid(-r_l)  # (B,)
    return losses.mean(), _pair_metrics(r_w, r_l, policy_chosen_logps, policy_rejected_logps)


class BCOState(NamedTuple):
    """BCO's running reward shift delta: the mean of the batch-mean rewards over the ``count`` steps seen.

    A trainer starts with ``None`` and passes ``BCOState.from_metrics(m)`` on; save it with the trainer
    state to resume exactly.
    """

    delta: float
    count: int

    @classmethod
    def from_metrics(cls, metrics: dict[str, Tensor]) -> "BCOState":
        return cls(float(metrics["bco/delta"]), int(metrics["bco/count"]))


def bco_update_state(rewards: Tensor, state: BCOState | None) -> BCOState:
    """delta <- delta + (mean(rewards) - delta) / (count + 1): the running mean of the batch means.

    The batch mean is over the 2B rewards (chosen and rejected together), as in the BCO reference code and
    TRL < 1.0 (its ``RunningMoments`` fed one scalar per step). Example: state (1.0, 1), rewards [2, 4] -> (2.0, 2).
    """
    m = float(rewards.detach().double().mean())
    if state is None:
        return BCOState(m, 1)
    count = state.count + 1
    return BCOState(state.delta + (m - state.delta) / count, count)


def bco_pair_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
    reward_shift: float = 1.0,
    state: BCOState | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """BCO: L = -log sigma(r_w - delta) - log sigma(-(r_l - delta)), r = beta lr  (Jung et al. 2024, paired form).

    "Binary Classifier Optimization for Large Language Model Alignment": a binary classifier whose logit
    is the implicit reward, chosen = class 1, rejected = class 0. The reward shift delta (the running mean
    reward, :func:`bco_update_state`, updated with this batch first and detached) centres the logits: the
    paper bounds DPO's loss by this classification loss and chooses delta to tighten the bound. ``reward_shift`` scales delta: 1 is the paper (and TRL < 1.0);
    0 is TRL 1.16's ``bco_pair``, which dropped the shift (the state is still tracked and logged).
    Extra metrics ``bco/delta`` (the running mean, unscaled) and ``bco/count``.
    Example: r_w = 1, r_l = -1, no state -> delta = 0 -> 2 * -log sigma(1) = 0.6265.
    """
    lr_w, lr_l, r_w, r_l = _rewards(
        beta, policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    new_state = bco_update_state(torch.cat([r_w, r_l]), state)
    delta = reward_shift * new_state.delta
    losses = -F.logsigmoid(r_w - delta) - F.logsigmoid(-(r_l - delta))  # (B,)
    metrics = _pair_metrics(r_w, r_l, policy_chosen_logps, policy_rejected_logps)
    metrics["bco/delta"] = torch.tensor(new_state.delta, dtype=torch.float64, device=r_w.device)
    metrics["bco/count"] = torch.tensor(float(new_state.count), dtype=torch.float64, device=r_w.device)
    return losses.mean(), metrics


def sppo_hard_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SPPO (hard): L = (lr_w - 1/(2 beta))^2 + (lr_l + 1/(2 beta))^2  (Wu et al. 2024, eq. 4.7 with P(y_w > y_l) = 1).

    "Self-Play Preference Optimization": regress each log-ratio onto beta^-1 (P - 1/2), with the win
    probability P set to 1 for the chosen and 0 for the rejected completion (the soft P of the paper comes
    from a preference model, outside the loss).
    Example: beta=0.5, lr_w = lr_l = 0 -> (0 - 1)^2 + (0 + 1)^2 = 2.
    """
    lr_w, lr_l, r_w, r_l = _rewards(
        beta, policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    losses = (lr_w - 0.5 / beta) ** 2 + (lr_l + 0.5 / beta) ** 2  # (B,)
    return losses.mean(), _pair_metrics(r_w, r_l, policy_chosen_logps, policy_rejected_logps)


def apo_zero_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """APO-zero: L = (1 - sigma(r_w)) + sigma(r_l)  (D'Oosterlinck et al. 2024, "Anchored Preference Optimization", eq. 7).

    For chosen answers better than the model's own: raise the chosen likelihood, lower the rejected one,
    each anchored at reward 0. Example: r_w = r_l = 0 -> 0.5 + 0.5 = 1.
    """
    lr_w, lr_l, r_w, r_l = _rewards(
        beta, policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    losses = (1 - torch.sigmoid(r_w)) + torch.sigmoid(r_l)  # (B,)
    return losses.mean(), _pair_metrics(r_w, r_l, policy_chosen_logps, policy_rejected_logps)


def apo_down_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """APO-down: L = sigma(r_w) + (1 - sigma(r_w - r_l))  (D'Oosterlinck et al. 2024, eq. 8).

    For chosen answers worse than the model's own: lower the chosen likelihood, and the rejected one more.
    Example: r_w = 1, r_l = 0 -> sigma(1) + 1 - sigma(1) = 1 (and r_w = r_l = 0 -> 1 as well).
    """
    lr_w, lr_l, r_w, r_l = _rewards(
        beta, policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    losses = torch.sigmoid(r_w) + (1 - torch.sigmoid(r_w - r_l))  # (B,)
    return losses.mean(), _pair_metrics(r_w, r_l, policy_chosen_logps, policy_rejected_logps)
