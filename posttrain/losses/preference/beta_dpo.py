"""beta-DPO (Wu et al. 2024): DPO with a batch-adaptive beta and Gaussian data filtering.

The running statistics of the reward gap are the loss's state (:class:`BetaDPOState`): passed in, returned
through ``metrics``, saved with the trainer state so a resumed run continues exactly. Not handled: the
all-gather the batch statistics would need on several ranks.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from posttrain.losses.preference.base import Tensor, _check_beta, _logratios, _pair_metrics


class BetaDPOState(NamedTuple):
    """Running statistics of the beta-DPO reward gap M = h, carried by the trainer between steps.

    ``gap_mean`` is the threshold M_0 of the paper; ``gap_std`` its running spread sigma. A trainer
    starts with ``None`` (initialise from the first batch) and passes ``BetaDPOState.from_metrics(m)``
    on; save it with the trainer state to resume exactly.
    """

    gap_mean: float
    gap_std: float

    @classmethod
    def from_metrics(cls, metrics: dict[str, Tensor]) -> "BetaDPOState":
        return cls(float(metrics["beta_dpo/gap_mean"]), float(metrics["beta_dpo/gap_std"]))


def beta_dpo_update_state(gap: Tensor, state: BetaDPOState | None, momentum: float = 0.9) -> BetaDPOState:
    """M_0 <- m * M_0 + (1 - m) * mean(M), sigma <- m * sigma + (1 - m) * std(M)   (Wu et al. 2024, eq. 7).

    ``state=None`` starts from the batch's own statistics (the reference code starts from 0, which
    biases the first hundred or so steps towards 0; pass ``BetaDPOState(0.0, 0.0)`` to reproduce it).
    std is the unbiased sample standard deviation (0 for a batch of one).
    Example: gap=[1, 3], state=(0, 0), m=0.9 -> mean 2, std 1.4142 -> (0.2, 0.14142).
    """
    gap = gap.detach().double()
    mean = float(gap.mean())
    std = float(gap.std()) if gap.numel() > 1 else 0.0
    if state is None:
        return BetaDPOState(mean, std)
    return BetaDPOState(
        momentum * state.gap_mean + (1 - momentum) * mean, momentum * state.gap_std + (1 - momentum) * std
    )


def beta_dpo_filter(
    gap: Tensor, state: BetaDPOState, filter_ratio: float, generator: torch.Generator | None = None
) -> Tensor:
    """Keep a (1 - rho) fraction of pairs, sampled without replacement with p_i ~ exp(-(M_i - M_0)^2 / (2 sigma^2)).

    Wu et al. 2024, Section 4.2 ("beta-guided data filtering"): pairs whose gap is far from the running
    mean, in either direction (trivially easy or likely mislabelled), are the least likely to be kept.
    Returns a (B,) bool mask with max(1, int(B * (1 - filter_ratio))) entries set. Weights are floored
    at 1e-30 so that multinomial sampling without replacement is always possible.
    """
    if not 0.0 <= filter_ratio < 1.0:
        raise ValueError(f"filter_ratio={filter_ratio} must be in [0, 1)")
    gap = gap.detach()
    n = gap.numel()
    keep_n = max(1, int(n * (1 - filter_ratio)))
    if keep_n >= n:
        return torch.ones(n, dtype=torch.bool, device=gap.device)
    sigma = max(state.gap_std, 1e-8)
    weights = torch.exp(-0.5 * ((gap.double() - state.gap_mean) / sigma) ** 2).clamp_min(1e-30)  # (B,)
    idx = torch.multinomial(weights.cpu(), keep_n, replacement=False, generator=generator).to(gap.device)
    mask = torch.zeros(n, dtype=torch.bool, device=gap.device)
    mask[idx] = True
    return mask


def beta_dpo_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
    alpha: float = 0.6,
    filter_ratio: float = 0.2,
    momentum: float = 0.9,
    state: BetaDPOState | None = None,
    generator: torch.Generator | None = None,
    min_beta: float = 1e-3,
) -> tuple[Tensor, dict[str, Tensor]]:
    """beta-DPO: L = mean_{i in S} -log sigma(beta_b * h_i), beta_b = beta * (1 + alpha * (mean_{i in S} M_i - M_0))  (Wu et al. 2024, eqs. 6-8).

    Reading of the paper and its reference code (github.com/junkangwu/beta-DPO, ``trainers.py``):
      1. the gap M_i = h_i is the DPO log-ratio margin (without beta), detached;
      2. running statistics are updated with this batch first (:func:`beta_dpo_update_state`,
         momentum 0.9): M_0 = running mean, sigma = running std;
      3. a subset S of (1 - filter_ratio) * B pairs is sampled with Gaussian weights around M_0
         (:func:`beta_dpo_filter`; the paper's default keeps 80%);
      4. beta_b is computed from the mean gap of S, clamped at ``min_beta`` and detached: a batch of
         informative, large-gap pairs gets a larger beta (stay close to the reference), a batch of
         near-ties a smaller one (move further);
      5. the loss is the DPO loss with beta_b averaged over S only.
    The state is passed in and returned (in ``metrics``), so the function stays pure; ``generator``
    makes the sampling reproducible. Rewards are logged with the base beta, as in the reference code.
    Extra metrics: ``beta_dpo/beta``, ``beta_dpo/kept``, ``beta_dpo/gap_mean``, ``beta_dpo/gap_std``.
    Example (no filtering): beta=0.1, alpha=1, gaps [1, 3], state (0.5, 1), m=0.5 -> M_0 = 1.25, beta_b = 0.1 * 1.75.
    """
    _check_beta(beta)
    chosen_lr, rejected_lr = _logratios(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    h = chosen_lr - rejected_lr  # (B,)
    new_state = beta_dpo_update_state(h, state, momentum)
    keep = beta_dpo_filter(h, new_state, filter_ratio, generator)  # (B,) bool
    beta_b = max(beta * (1 + alpha * (float(h.detach()[keep].double().mean()) - new_state.gap_mean)), min_beta)
    losses = -F.logsigmoid(beta_b * h)  # (B,)
    loss = losses[keep].mean()
    metrics = _pair_metrics(beta * chosen_lr, beta * rejected_lr, policy_chosen_logps, policy_rejected_logps)
    dev = h.device
    metrics["beta_dpo/beta"] = torch.tensor(beta_b, device=dev)
    metrics["beta_dpo/kept"] = keep.float().mean()
    metrics["beta_dpo/gap_mean"] = torch.tensor(new_state.gap_mean, dtype=torch.float64, device=dev)
    metrics["beta_dpo/gap_std"] = torch.tensor(new_state.gap_std, dtype=torch.float64, device=dev)
    return loss, metrics
