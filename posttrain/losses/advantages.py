"""Advantage estimators: how much better than a baseline each sampled completion (or token) did.

Key insight: the policy gradient ``E[grad log pi(y|x) * A]`` is unchanged by subtracting any baseline ``b``
that does not depend on the sampled ``y`` (``E[grad log pi * b] = b * grad sum_y pi(y) = 0``), but the
variance drops when ``b`` tracks the expected reward. The estimators differ only in the baseline:
(a mean that includes r_i itself -- REINFORCE's batch mean, GRPO's group mean -- depends on y_i a little: the
gradient shrinks by exactly 1 - 1/N, measured by ``posttrain lab baseline-variance``; RLOO's leave-one-out
mean does not)

    REINFORCE   A_i = r_i                       (or r_i - mean_batch(r))
    RLOO        A_i = r_i - mean_{j != i} r_j    = G/(G-1) * (r_i - mean_group(r))   (Ahmadian et al. 2024)
    GRPO        A_i = (r_i - mean_group(r)) / (std + eps)                           (Shao et al. 2024)
                      std over the group ("group"), the whole batch ("batch"), or 1 ("none": Dr. GRPO)
    GAE         A_t = sum_l (gamma*lam)^l delta_{t+l},  delta_t = r_t + gamma V_{t+1} - V_t  (Schulman 2015)
                per token, baseline V(s_t) from a learned critic (PPO): :func:`gae`, with masked whitening

Layout: sequence-level rewards arrive flat, shape (B*G,), **prompt-major**: the G samples of prompt 0,
then the G samples of prompt 1, ... ``rewards.view(B, G)`` recovers the groups. Every sequence-level
estimator returns ``(advantages, metrics)`` with advantages of shape (B*G,) (broadcast over the tokens by
the loss) and ``metrics["zero_std_frac"]``: the fraction of groups whose rewards are all equal, which
carry no learning signal; their advantages are exactly 0 (never NaN), whatever the scaling.

GAE is the one per-token estimator: (B, T) rewards (the sequence reward on the last real token, minus the
per-token KL penalty) and values in, (B, T) advantages and returns out (:func:`gae`).

Not handled here: per-token rewards for the sequence-level estimators (fold a KL penalty into sequence
rewards first, see ``kl.py``), NaN rewards (score every completion; a failed verifier returns 0).
The std is Bessel-corrected (unbiased), as in TRL, so the numbers match its GRPOTrainer.
"""

from __future__ import annotations

import torch

from posttrain.errors import ConfigError
from posttrain.losses.logprobs import masked_whiten


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be flat (B*G,), got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"{rewards.numel()} rewards cannot be split into groups of {group_size}")
    return rewards.view(-1, group_size)  # (B, G)


def zero_std_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Bool (B,): True where every reward of the group is identical.  [1,1,0,1] with G=2 -> [True, False]."""
    g = _groups(rewards, group_size)
    return g.amax(dim=1) == g.amin(dim=1)


def _metrics(rewards: torch.Tensor, advantages: torch.Tensor, group_size: int) -> dict[str, float]:
    return {
        "zero_std_frac": zero_std_groups(rewards, group_size).float().mean().item(),
        "advantage_mean": advantages.mean().item(),
        "advantage_std": advantages.std().item() if advantages.numel() > 1 else 0.0,
        "advantage_abs_max": advantages.abs().max().item() if advantages.numel() else 0.0,
    }


def reinforce_advantages(rewards: torch.Tensor, group_size: int = 1, baseline: str = "none"):
    """REINFORCE (Williams 1992): A_i = r_i, or r_i - mean(r) over the whole batch with ``baseline="batch_mean"``.

    ``group_size`` only feeds the zero-variance metric (the estimator ignores groups).
    Example: r=[1, 0, 0, 1], baseline="batch_mean" -> A=[0.5, -0.5, -0.5, 0.5].
    """
    _groups(rewards, group_size)
    rewards = rewards.float()
    if baseline not in REINFORCE_BASELINES:
        raise ConfigError(f"baseline={baseline!r} is not valid; choose one of: {', '.join(REINFORCE_BASELINES)}")
    advantages = REINFORCE_BASELINES[baseline](rewards)  # (N,)
    return advantages, _metrics(rewards, advantages, group_size)


REINFORCE_BASELINES = {
    "none": lambda r: r.clone(),
    "batch_mean": lambda r: torch.zeros_like(r) if r.numel() == 0 or r.max() == r.min() else r - r.mean(),
}


def rloo_advantages(rewards: torch.Tensor, group_size: int):
    """RLOO: A_i = r_i - (sum_j r_j - r_i) / (G - 1), the mean of the *other* samples of the same prompt.

    The baseline excludes r_i, so it is independent of sample i and the estimate is unbiased.
    Example (G=3): r=[1, 0, 0] -> baselines [0, .5, .5] -> A=[1, -.5, -.5].
    """
    if group_size < 2:
        raise ConfigError("RLOO needs group_size >= 2 (a leave-one-out baseline needs another sample)")
    g = _groups(rewards, group_size).float()  # (B, G)
    baseline = (g.sum(dim=1, keepdim=True) - g) / (group_size - 1)  # (B, G)
    advantages = g - baseline
    advantages = torch.where(zero_std_groups(rewards, group_size)[:, None], torch.zeros_like(g), advantages)
    advantages = advantages.reshape(-1)  # (B*G,)
    return advantages, _metrics(rewards, advantages, group_size)


def grpo_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str = "group", eps: float = 1e-4):
    """GRPO: A_i = (r_i - mean_group(r)) / (std + eps) (Shao et al. 2024, DeepSeekMath sec. 4.1.2).

    ``scale_rewards``: "group" divides by the group's std; "batch" by the std of all rewards in the batch
    (centering stays per group); "none" does not divide (Dr. GRPO, Liu et al. 2025: the std term
    up-weights near-uniform groups). std is unbiased (Bessel), eps=1e-4 as in TRL.
    Example (G=2, "group"): r=[1, 0] -> mean .5, std .7071 -> A=[.7070, -.7070].
    An all-equal group gets A=0 exactly (no 0/0, no float residue of mean()).
    """
    if scale_rewards not in GRPO_SCALINGS:
        raise ConfigError(f"scale_rewards={scale_rewards!r} is not valid; choose one of: {', '.join(GRPO_SCALINGS)}")
    g = _groups(rewards, group_size).float()  # (B, G)
    centered = g - g.mean(dim=1, keepdim=True)  # (B, G)
    advantages = centered / GRPO_SCALINGS[scale_rewards](g, eps)  # (B, G)
    advantages = torch.where(zero_std_groups(rewards, group_size)[:, None], torch.zeros_like(g), advantages)
    advantages = advantages.reshape(-1)  # (B*G,)
    return advantages, _metrics(rewards, advantages, group_size)


def _std(x: torch.Tensor, dim=None) -> torch.Tensor:
    n = x.numel() if dim is None else x.shape[dim]
    if n < 2:
        return torch.zeros(()) if dim is None else torch.zeros(x.shape[0], 1)
    return x.std() if dim is None else x.std(dim=dim, keepdim=True)


GRPO_SCALINGS = {
    "group": lambda g, eps: _std(g, dim=1) + eps,  # (B, 1)
    "batch": lambda g, eps: _std(g) + eps,  # ()
    "none": lambda g, eps: torch.ones(()),
}


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
    critic_lam: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE: A_t = sum_l (gamma*lam)^l delta_{t+l}, delta_t = r_t + gamma V_{t+1} - V_t (Schulman et al. 2015, eq. 16).

    rewards, values, mask: (B, T) token sequences of any length each (mask 1 on real tokens; padding on
    either side or holes in the middle, e.g. masked tool output). Only real tokens are steps: ``t + 1`` is the
    next *real* token, so a masked slot's reward and value are never read (the running ``V_{t+1}`` and
    ``A_{t+1}`` are carried across it); the episode ends at the last real token (V after it is 0).
    Returns ``(advantages, returns)``, both (B, T), 0 on masked slots. ``returns = A + V`` is the value target
    (the TD(lambda) return). ``critic_lam`` decouples the critic's lambda (VC-PPO, Yuan et al. 2025: 1.0 for the
    critic, 0.95 for the actor): the returns are then ``A(critic_lam) + V`` while the advantages use ``lam``.

    Vectorised over the batch: one reverse scan over T with (B,) state, no Python loop over rows.
    lam = 0 gives A_t = delta_t; gamma = lam = 1 gives (sum of future rewards) - V_t; with V = 0 as well,
    the REINFORCE return-to-go.
    Example (T=2, gamma=lam=1): r=[0, 1], V=[.5, .5] -> delta=[0, .5] -> A=[.5, .5], returns=[1, 1].
    """
    if not (rewards.shape == values.shape == mask.shape) or rewards.dim() != 2:
        raise ValueError(
            f"rewards, values, mask must share a (B, T) shape; got {tuple(rewards.shape)}, "
            f"{tuple(values.shape)}, {tuple(mask.shape)}"
        )
    for name, x in (("gamma", gamma), ("lam", lam), ("critic_lam", 0.0 if critic_lam is None else critic_lam)):
        if not 0.0 <= x <= 1.0:
            raise ConfigError(f"{name}={x} must be in [0, 1]")
    dtype = torch.promote_types(rewards.dtype, values.dtype)
    real = mask.bool()
    m = real.to(dtype)
    zeros = torch.zeros((), dtype=dtype, device=values.device)
    rewards = torch.where(real, rewards.to(dtype), zeros)  # garbage (even NaN) in masked slots never enters
    values = torch.where(real, values.to(dtype), zeros)
    lams = (lam,) if critic_lam is None or critic_lam == lam else (lam, critic_lam)
    B, T = values.shape
    next_value = torch.zeros(B, dtype=dtype, device=values.device)  # V of the next real token (0 past the end)
    last = [torch.zeros(B, dtype=dtype, device=values.device) for _ in lams]  # A of the next real token
    outs = [torch.zeros(B, T, dtype=dtype, device=values.device) for _ in lams]
    for t in range(T - 1, -1, -1):
        mt, vt = m[:, t], values[:, t]
        delta = rewards[:, t] + gamma * next_value - vt  # (B,)
        for i, lm in enumerate(lams):
            a = delta + gamma * lm * last[i]
            last[i] = mt * a + (1.0 - mt) * last[i]  # a masked slot carries the state through unchanged
            outs[i][:, t] = mt * a
        next_value = mt * vt + (1.0 - mt) * next_value
    advantages = outs[0]
    returns = (outs[-1] + values) * m
    return advantages, returns


gae_advantages = gae  # the name of the first version (tests/losses/test_advantages.py)


def masked_whiten_advantages(advantages: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(A - mean) / std over the real tokens only, 0 on masked slots (PPO's advantage whitening; TRL, OpenRLHF).

    Garbage in masked slots changes neither the mean nor the std. A batch with one real token (or all equal)
    gives 0s, never NaN. Example: A=[[1, 3, junk]], mask=[[1, 1, 0]] -> mean 2, std (Bessel) 1.414 -> [-.707, .707, 0].
    """
    real = mask.bool()
    x = torch.where(real, advantages, torch.zeros_like(advantages))
    return torch.where(real, masked_whiten(x, real.to(x.dtype), eps=eps), torch.zeros_like(x))


def whiten_rewards(scores: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Sequence scores (N,) scaled to unit std over the batch, mean kept (TRL's ``whiten_rewards``: shift_mean=False).

    Keeping the mean keeps the sign of "better than nothing"; only the scale is normalised. One score -> itself.
    """
    if scores.numel() < 2:
        return scores.clone()
    return masked_whiten(scores, torch.ones_like(scores), shift_mean=False, eps=eps)


# Sequence-level estimators with the signature (rewards (B*G,), group_size, **options) -> (advantages, metrics).
ADVANTAGE_ESTIMATORS = {"reinforce": reinforce_advantages, "rloo": rloo_advantages, "grpo": grpo_advantages}
