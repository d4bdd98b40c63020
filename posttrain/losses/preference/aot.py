"""AOT (Melnyk et al. 2024, "Distributional Preference Alignment of LLMs via Optimal Transport").

Key insight: instead of a per-pair margin, ask the *distribution* of chosen rewards to dominate the
distribution of rejected rewards stochastically (first order). In one dimension the optimal transport plan
between two empirical distributions matches sorted values, so the loss is the logistic (cDPO) loss on the
differences of *sorted* batch quantities:

    aot           delta = sort(lp_w - lp_l) - sort(lpref_w - lpref_l)      (paired: policy vs reference margins)
    aot_unpaired  delta = sort(lr_w) - sort(lr_l)                         (unpaired: chosen vs rejected log-ratios)
    L = mean_i [-(1 - eps) log sigma(beta delta_i) - eps log sigma(-beta delta_i)]

The sort runs over the batch, so the loss couples the pairs of a batch (and is not a mean of per-pair terms;
it changes with the batch split). Rewards logged: beta * log-ratio per pair, as TRL.
"""

from __future__ import annotations

from posttrain.losses.preference.base import Tensor, _check_beta, _logratios, _pair_metrics, _smoothed_logistic


def _check_eps(label_smoothing: float) -> None:
    if not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 0.5]")


def aot_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """AOT (paired): L = mean_i -log sigma(beta * (sort(lp_w - lp_l)_i - sort(lpref_w - lpref_l)_i))  (Melnyk et al. 2024).

    Example: beta=1, policy margins [2, 0], reference margins [0, 1] -> sorted [0, 2] - [0, 1] = [0, 1]
    -> (log 2 + log(1 + e^-1)) / 2 = 0.5032.
    """
    _check_beta(beta)
    _check_eps(label_smoothing)
    chosen_lr, rejected_lr = _logratios(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    policy_margin = (policy_chosen_logps - policy_rejected_logps).sort().values  # (B,)
    ref_margin = (ref_chosen_logps - ref_rejected_logps).sort().values
    losses = _smoothed_logistic(beta * (policy_margin - ref_margin), label_smoothing)
    metrics = _pair_metrics(beta * chosen_lr, beta * rejected_lr, policy_chosen_logps, policy_rejected_logps)
    return losses.mean(), metrics


def aot_unpaired_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """AOT (unpaired): L = mean_i -log sigma(beta * (sort(lr_w)_i - sort(lr_l)_i))  (Melnyk et al. 2024).

    Example: beta=1, chosen log-ratios [0, 3], rejected [2, -1] -> sorted [0, 3] - [-1, 2] = [1, 1]
    -> -log sigma(1) = 0.3133.
    """
    _check_beta(beta)
    _check_eps(label_smoothing)
    chosen_lr, rejected_lr = _logratios(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    delta = chosen_lr.sort().values - rejected_lr.sort().values  # (B,)
    losses = _smoothed_logistic(beta * delta, label_smoothing)
    metrics = _pair_metrics(beta * chosen_lr, beta * rejected_lr, policy_chosen_logps, policy_rejected_logps)
    return losses.mean(), metrics
