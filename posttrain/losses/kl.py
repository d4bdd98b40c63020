"""Per-token estimators of KL(pi || pi_ref), the coefficient controllers, and folding KL into rewards.

Key insight (Schulman, "Approximating KL divergence", 2020): with tokens sampled from pi and
``log_r = ref_logps - logps`` (so r = pi_ref / pi), three single-sample estimators of KL(pi || pi_ref):

    k1 = -log_r                   unbiased, high variance, can be negative
    k2 = (log_r)^2 / 2            biased (low for close policies), always >= 0, low variance
    k3 = (r - 1) - log_r          unbiased (E_pi[r] = 1), always >= 0, low variance   (used by GRPO)

Two ways to use the estimate: as a loss term ``beta * KL`` (GRPO, differentiated through ``logps``) or
folded into the reward as a per-token penalty ``r_t - beta * KL_t`` (PPO/RLHF, Ziegler et al. 2019), via
:func:`kl_penalized_token_rewards` / :func:`kl_penalized_rewards`. The coefficient ``beta`` is fixed or
adaptive (Ziegler et al. 2019, sec. 2.2):

    e = clip(KL / target - 1, -0.2, 0.2);   beta <- beta * (1 + e * n_steps / horizon)

Controllers keep their whole state in a plain dict (``state_dict`` / ``load_state_dict``) so that a
resumed run continues with the exact same beta. Not handled: KL over the full vocabulary (exact KL needs
both distributions' logits; these estimators need only the sampled tokens' log-probs).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from posttrain.errors import ConfigError


def k1_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """k1 = log pi - log pi_ref per token.  logps=-1, ref=-2 -> 1."""
    return logps - ref_logps


def k2_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """k2 = (log pi - log pi_ref)^2 / 2 per token.  logps=-1, ref=-2 -> 0.5."""
    return 0.5 * (logps - ref_logps) ** 2


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """k3 = exp(ref - logp) - (ref - logp) - 1 per token.  logps=-1, ref=-2 -> e^-1 + 1 - 1 = 0.3679."""
    log_r = ref_logps - logps
    return torch.expm1(log_r) - log_r  # expm1 keeps precision when the policies are close


KL_ESTIMATORS = {"k1": k1_kl, "k2": k2_kl, "k3": k3_kl}


def kl_estimate(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL estimate by name, shape of ``logps``."""
    if estimator not in KL_ESTIMATORS:
        raise ConfigError(f"kl_estimator={estimator!r} is not valid; choose one of: {', '.join(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[estimator](logps, ref_logps)


def kl_penalized_token_rewards(
    rewards: torch.Tensor,
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    estimator: str = "k1",
) -> torch.Tensor:
    """Per-token rewards ``-beta * KL_t``, plus the sequence reward on each sequence's last real token.

    rewards: (B,) sequence rewards; logps, ref_logps, mask: (B, T) right-padded. Returns (B, T), 0 on
    padding, detached (a reward is a constant for the policy gradient). This is the PPO/RLHF shaping
    (Ziegler et al. 2019; Ouyang et al. 2022) fed to GAE. A sequence with no real token gets nothing.
    Example: r=[1], kl=[.1, .2], beta=.5 -> [-.05, 1 - .1].
    """
    mask = mask.to(logps.dtype)
    kl = kl_estimate(logps.detach(), ref_logps.detach(), estimator) * mask  # (B, T)
    lengths = mask.sum(-1).long()  # (B,)
    last = (lengths - 1).clamp_min(0)  # (B,)
    has_tokens = (lengths > 0).to(logps.dtype)
    out = -beta * kl
    return out.scatter_add(1, last[:, None], (rewards.to(logps.dtype) * has_tokens)[:, None])


def kl_penalized_rewards(
    rewards: torch.Tensor,
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    estimator: str = "k1",
) -> torch.Tensor:
    """Sequence rewards ``r - beta * sum_t KL_t`` (B,): the per-token penalty summed, for sequence-level estimators.

    Equals ``kl_penalized_token_rewards(...).sum(-1)``; feed it to GRPO/RLOO/REINFORCE advantages to apply
    the KL "in the reward" instead of in the loss.
    """
    mask = mask.to(logps.dtype)
    kl = kl_estimate(logps.detach(), ref_logps.detach(), estimator) * mask  # (B, T)
    return rewards.to(logps.dtype) - beta * kl.sum(-1)


@dataclasses.dataclass
class FixedKLController:
    """A constant coefficient: ``value`` never changes (``update`` is a no-op kept for a uniform interface)."""

    value: float

    def update(self, current_kl: float, n_steps: int = 1) -> float:
        return self.value

    def state_dict(self) -> dict:
        return {"kind": "fixed", "value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


@dataclasses.dataclass
class AdaptiveKLController:
    """Adaptive beta (Ziegler et al. 2019, sec. 2.2): raise it when the KL runs above ``target``, lower it below.

    e = clip(KL/target - 1, -0.2, 0.2);  value *= 1 + e * n_steps / horizon.
    Example: value=.1, target=6, horizon=10000, KL=12, n_steps=256 -> e=.2 -> value=.1*(1+.00512)=.100512.
    """

    value: float
    target: float
    horizon: float = 10000.0

    def __post_init__(self):
        if self.target <= 0 or self.horizon <= 0:
            raise ConfigError(f"adaptive KL needs target > 0 and horizon > 0 (got {self.target}, {self.horizon})")

    def update(self, current_kl: float, n_steps: int = 1) -> float:
        """``current_kl`` in the unit of ``target`` (the trainer states which); n_steps: sequences (Ziegler) or steps.
        A non-finite KL leaves beta unchanged (a NaN would otherwise poison every later step)."""
        if not math.isfinite(current_kl):
            return self.value
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict:
        return {"kind": "adaptive", "value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.target, self.horizon = float(state["value"]), float(state["target"]), float(state["horizon"])


@dataclasses.dataclass
class PPOKLController:
    """The adaptive penalty of the PPO paper (Schulman et al. 2017, sec. 4), for KL(pi_old || pi) in the loss.

    After each policy update with measured d = KL(pi_old || pi): d < target / 1.5 -> beta / 2;
    d > 1.5 * target -> beta * 2; otherwise unchanged (the paper's constants 1.5 and 2).
    Example: value=1, target=.01, d=.02 -> 2; then d=.001 -> 1.
    """

    value: float
    target: float = 0.01  # d_targ; the paper tries 0.003, 0.01, 0.03

    def __post_init__(self):
        if self.target <= 0 or self.value <= 0:
            raise ConfigError(f"the PPO KL controller needs target > 0 and beta > 0 (got {self.target}, {self.value})")

    def update(self, current_kl: float, n_steps: int = 1) -> float:
        if math.isfinite(current_kl):
            if current_kl < self.target / 1.5:
                self.value /= 2.0
            elif current_kl > self.target * 1.5:
                self.value *= 2.0
        return self.value

    def state_dict(self) -> dict:
        return {"kind": "ppo", "value": self.value, "target": self.target}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.target = float(state["value"]), float(state["target"])


KL_CONTROLLERS = {"fixed": FixedKLController, "adaptive": AdaptiveKLController, "ppo": PPOKLController}


def kl_controller_from_state(state: dict):
    """Rebuild a controller from its ``state_dict()`` (the ``kind`` key picks the class)."""
    state = dict(state)
    kind = state.pop("kind")
    if kind not in KL_CONTROLLERS:
        raise ConfigError(f"unknown KL controller kind {kind!r}; choose one of: {', '.join(KL_CONTROLLERS)}")
    return KL_CONTROLLERS[kind](**state)
