"""f-DPO (Wang et al. 2023, "Beyond Reverse KL: Generalizing DPO with Diverse Divergence Constraints").

Key insight: replace the reverse KL of the RLHF objective by an f-divergence D_f(pi || pi_ref). The optimum
then satisfies r(x, y) = beta * f'(u) + const with u = pi(y|x) / pi_ref(y|x), so DPO's margin becomes

    h_f = f'(u_w) - f'(u_l)            L = -log sigma(beta * h_f)

with f'(u) = log u for the reverse KL (plain DPO), and (constant shifts cancel in the difference)

    forward KL        f'(u) = 1 - 1/u
    Jensen-Shannon    f'(u) = log(2u / (1 + u)) = log 2 + log sigma(log u)
    alpha-divergence  f'(u) = (u^(alpha - 1) - 1) / (alpha - 1)       (-> log u as alpha -> 1)

``alpha`` is TRL's ``f_alpha_divergence_coef`` (default 0.5); the paper writes f'(u) = (1 - u^(-a)) / a, i.e.
a = 1 - alpha (the default 0.5 is the same in both). The exponent (alpha - 1) log u is clamped at 80 so
that exp stays finite, as TRL does in float32. The table :data:`F_DIVERGENCES` maps TRL's
``f_divergence_type`` names to f'(u) on log u; here the f-divergences are DPO's (sigmoid) loss only —
TRL also lets hinge/IPO/EXO/robust/DiscoPOP/sigmoid_norm use them, posttrain does not (yet).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from posttrain.losses.preference.base import Tensor, _check_beta, _logratios, _pair_metrics

_MAX_EXPONENT = 80.0


def _alpha_score(log_u: Tensor, alpha: float) -> Tensor:
    if abs(alpha - 1.0) < 1e-6:  # the limit is the reverse KL
        return log_u
    return torch.expm1(((alpha - 1.0) * log_u).clamp(max=_MAX_EXPONENT)) / (alpha - 1.0)


F_DIVERGENCES: dict[str, Callable[[Tensor, float], Tensor]] = {
    "reverse_kl": lambda log_u, alpha: log_u,
    "forward_kl": lambda log_u, alpha: -torch.expm1(-log_u),  # 1 - 1/u
    "js_divergence": lambda log_u, alpha: math.log(2.0) + F.logsigmoid(log_u),
    "alpha_divergence": _alpha_score,
}
"""TRL's ``f_divergence_type`` -> f'(u) as a function of (log u, alpha), elementwise."""


def f_dpo_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    divergence: str = "reverse_kl",
    beta: float = 0.1,
    alpha: float = 0.5,
) -> tuple[Tensor, dict[str, Tensor]]:
    """f-DPO: L = -log sigma(beta * (f'(u_w) - f'(u_l))), u = pi/pi_ref, f' from :data:`F_DIVERGENCES`  (Wang et al. 2023).

    Rewards logged: beta * log u, as TRL (whatever the divergence). Extra metric ``fdpo/margin``: mean h_f.
    Example: forward KL, beta=1, log u_w = log 2, log u_l = 0 -> h_f = 0.5 -> -log sigma(0.5) = 0.4741.
    """
    _check_beta(beta)
    if divergence not in F_DIVERGENCES:
        raise ValueError(f"divergence={divergence!r} is not valid; choose one of: {', '.join(F_DIVERGENCES)}")
    chosen_lr, rejected_lr = _logratios(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    score = F_DIVERGENCES[divergence]
    h = score(chosen_lr, alpha) - score(rejected_lr, alpha)  # (B,)
    losses = -F.logsigmoid(beta * h)
    metrics = _pair_metrics(beta * chosen_lr, beta * rejected_lr, policy_chosen_logps, policy_rejected_logps)
    metrics["fdpo/margin"] = h.detach().mean()
    return losses.mean(), metrics


def forward_kl_dpo_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """f-DPO with the forward KL: f'(u) = 1 - 1/u (mass-covering). Example: beta=1, u_w=2, u_l=1 -> -log sigma(0.5) = 0.4741."""
    return f_dpo_loss(
        policy_chosen_logps=policy_chosen_logps,
        policy_rejected_logps=policy_rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
        divergence="forward_kl",
        beta=beta,
    )


def js_dpo_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """f-DPO with Jensen-Shannon: f'(u) = log(2u/(1+u)). Example: beta=1, u_w=2, u_l=1 -> h = log(4/3) -> 0.5596."""
    return f_dpo_loss(
        policy_chosen_logps=policy_chosen_logps,
        policy_rejected_logps=policy_rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
        divergence="js_divergence",
        beta=beta,
    )


def alpha_dpo_loss(
    *,
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
    alpha: float = 0.5,
) -> tuple[Tensor, dict[str, Tensor]]:
    """f-DPO with the alpha-divergence: f'(u) = (u^(alpha-1) - 1)/(alpha-1); alpha -> 1 is DPO, 0 the forward KL.

    Example: alpha=0.5, beta=1, u_w=4, u_l=1 -> f'(4) = (0.5 - 1)/(-0.5) = 1 -> -log sigma(1) = 0.3133.
    """
    return f_dpo_loss(
        policy_chosen_logps=policy_chosen_logps,
        policy_rejected_logps=policy_rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
        divergence="alpha_divergence",
        beta=beta,
        alpha=alpha,
    )
