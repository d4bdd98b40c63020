"""The per-token policy objectives of :func:`posttrain.losses.policy.policy_loss`, one function each.

With r = pi/pi_old (per token, or per sequence for GSPO: ``ratio_level``), A the advantage, lp = log pi:

    clip    -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) (dual clip optional)   PPO / GRPO / DAPO / GSPO / LUSPO
    cispo   -sg(min(r, 1 + eps_high)) A lp                                         CISPO, MiniMax-M1 (arXiv 2506.13585)
    sapo    -(4 / tau) sigma(tau (r - 1)) A,  tau = tau_pos if A > 0 else tau_neg  SAPO (arXiv 2511.20347)
    vespo   -sg(phi(w)) A lp,  phi(w) = exp(lambda + k log w - lambda w),          VESPO (arXiv 2602.10693)
            w = prod_t r_t the sequence ratio, (k, lambda) by the sign of A

(sg = stop-gradient.) CISPO and VESPO keep the gradient of every token and only scale it by a detached
weight (clipping never zeroes a token's gradient); SAPO replaces the clip by a smooth gate whose slope is 1
at r = 1 (so on-policy it is exactly REINFORCE) and decays away from it. LUSPO is not a new objective but an
aggregation (``seq_mean_token_sum`` with sequence ratios; LUSPO, arXiv 2602.05261). All as TRL 1.16's ``GRPOTrainer._compute_loss``
defines them; the one difference of parameterisation: TRL caps CISPO's ratio at ``epsilon_high`` itself,
posttrain at 1 + ``clip_eps_high`` (TRL's recommended 5.0 is clip_eps_high = 4.0).

Each function maps (B, T) tensors to the (B, T) per-token loss; the aggregation is the caller's.
"""

from __future__ import annotations

import math

import torch

Tensor = torch.Tensor

_VESPO_LOG_W_MIN = math.log(1e-8)  # the floor of log w, as the VESPO reference code (and TRL)


def clip_objective(
    *, ratio: Tensor, adv: Tensor, lo: float | None, hi: float | None, dual_clip: float | None = None, **_
) -> Tensor:
    """-min(r A, clip(r, 1 - lo, 1 + hi) A), floored at -c A for A < 0 with ``dual_clip`` c; no clip when lo is None.

    Example: r = e, A = 1, lo = hi = 0.2 -> -1.2 (and zero gradient).
    """
    obj = ratio * adv  # (B, T)
    if lo is not None:
        obj = torch.minimum(obj, ratio.clamp(1.0 - lo, 1.0 + hi) * adv)
    if dual_clip is not None:
        obj = torch.where(adv < 0, torch.maximum(obj, dual_clip * adv), obj)
    return -obj


def cispo_objective(*, logps: Tensor, ratio: Tensor, adv: Tensor, hi: float | None, **_) -> Tensor:
    """CISPO: -sg(min(r, 1 + eps_high)) * A * log pi  (MiniMax-M1 report, arXiv 2506.13585; no lower bound, as there).

    The gradient is sg(min(r, 1 + eps_high)) * A * grad log pi for every token: a clipped importance weight,
    never a dropped token. ``hi`` None means no cap.
    Example: r = 1, A = 2, log pi = -0.5 -> loss 1.0, d loss / d log pi = -2.
    """
    weight = ratio if hi is None else ratio.clamp(max=1.0 + hi)
    return -weight.detach() * adv * logps


def sapo_objective(
    *, ratio: Tensor, adv: Tensor, temperature_pos: float = 1.0, temperature_neg: float = 1.05, **_
) -> Tensor:
    """SAPO: -(4 / tau) * sigma(tau (r - 1)) * A, tau = temperature_pos where A > 0 else temperature_neg  ("Soft Adaptive Policy Optimization", arXiv 2511.20347).

    "Soft Adaptive Policy Optimization": d/dr = 4 sigma(1 - sigma) = 1 at r = 1 and falls off smoothly, so
    off-policy tokens are attenuated instead of cut; a higher temperature for negative advantages damps
    them faster (their updates are the less stable). TRL defaults: 1.0 and 1.05.
    Example: r = 1, A = 1, tau = 1 -> -(4 / 1) * 0.5 = -2.
    """
    if temperature_pos <= 0 or temperature_neg <= 0:
        raise ValueError(f"SAPO temperatures must be > 0 (got {temperature_pos}, {temperature_neg})")
    tau = torch.where(adv > 0, temperature_pos, temperature_neg).to(ratio.dtype)  # (B, 1|T)
    return -torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * adv


def vespo_weight(
    log_ratio: Tensor,
    mask: Tensor,
    adv: Tensor,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> Tensor:
    """VESPO's gamma weight phi(w) = exp(lambda + k log w - lambda w) per sequence (B, 1), detached; phi(1) = 1.

    w = exp(sum_t clamp(log r_t, -20, 20)) over the real tokens, log w clamped to [log 1e-8, 20];
    (k, lambda) = (k_pos, lambda_pos) where A >= 0, else the _neg pair; lambda floored at 1e-4; a
    non-finite phi becomes 0. phi rises as w^k for w < k / lambda and decays as exp(-lambda w) beyond.
    Example: w = 1 -> phi = 1 for any (k, lambda); k = 2, lambda = 3, w = 0.5 -> e^(3 - 1.5) / 4 = 1.1204.
    """
    with torch.no_grad():
        seq = (log_ratio.clamp(-20.0, 20.0) * mask).sum(-1, keepdim=True)  # (B, 1)
        log_w = seq.clamp(_VESPO_LOG_W_MIN, 20.0)
        a = adv if adv.shape[-1] == 1 else adv[:, :1]
        nonneg = a >= 0
        k = torch.where(nonneg, k_pos, k_neg).to(log_w.dtype)
        lam = torch.where(nonneg, lambda_pos, lambda_neg).to(log_w.dtype).clamp_min(1e-4)
        phi = torch.exp(lam + k * log_w - lam * log_w.exp())
        return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_objective(
    *,
    logps: Tensor,
    old_logps: Tensor,
    adv: Tensor,
    mask: Tensor,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
    **_,
) -> Tensor:
    """VESPO: -sg(phi(w)) * A * log pi  ("Variational Sequence-Level Soft Policy Optimization", arXiv 2602.10693).

    A smooth, asymmetric gamma gate on the *sequence* ratio w (:func:`vespo_weight`, computed from the
    token ratios whatever ``ratio_level``) in place of the hard clip. TRL defaults k/lambda: 2/3 for A >= 0,
    3/2 for A < 0.
    Example: on-policy (w = 1), A = 1, log pi = -0.5 -> loss 0.5, d loss / d log pi = -1 (REINFORCE).
    """
    phi = vespo_weight(logps - old_logps, mask, adv, k_pos, lambda_pos, k_neg, lambda_neg)  # (B, 1)
    return -phi * adv * logps


POLICY_OBJECTIVES = {"clip": clip_objective, "cispo": cispo_objective, "sapo": sapo_objective, "vespo": vespo_objective}
"""Objective name (TRL's ``loss_type`` where it names an objective) -> per-token loss function."""

OBJECTIVE_OPTIONS = {
    "clip": (),
    "cispo": (),
    "sapo": ("temperature_pos", "temperature_neg"),
    "vespo": ("k_pos", "lambda_pos", "k_neg", "lambda_neg"),
}
"""The options each objective takes (``objective_kwargs``); a trainer reads ``<objective>_<option>`` from its config."""

CLIPPED_SIDES = {"clip": (True, True), "cispo": (False, True), "sapo": (False, False), "vespo": (False, False)}
"""Which sides of [1 - eps_low, 1 + eps_high] an objective clips at (for the clip-fraction metrics)."""

OBJECTIVE_METRICS = {
    "vespo": lambda *, logps, old_logps, adv, mask, **opts: {
        "vespo/phi_mean": vespo_weight(logps - old_logps, mask, adv, **opts).mean().item()
    }  # per sequence, as TRL
}
"""Extra metrics of an objective: fn(logps, old_logps, adv, mask, **options) -> {name: float}."""
