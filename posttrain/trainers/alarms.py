"""Alarms for silent RL failure: conditions that leave a run "training" while it learns nothing or diverges.

Key insight: the common RL failures do not crash — they flatten a curve. A step's metrics already say so:

    rewards identical (reward_std == 0)          -> zero advantages everywhere: no gradient at all
    every group uniform (zero_std_frac == 1)     -> GRPO/RLOO get no signal although rewards vary across prompts
    truncated_frac == 1                          -> every completion hits the length limit (no EOS learned)
    ratio_max / approx_kl / kl beyond a bound    -> the policy left the trust region / drifted from the reference
    entropy < floor                              -> the policy collapsed onto one completion
    loss or grad_norm NaN/Inf                    -> the trainer must skip the step; M in a row -> stop
                                                    (counted by guards.NonFiniteGuard, shared with SFT/DPO/RM)

``Alarms.update(step, metrics)`` returns the warnings of this step (also logged on the
``posttrain.alarms`` logger) and sets ``skip_step`` / ``should_stop``. A condition fires when it has held for
``patience`` consecutive steps and then every ``repeat_every`` steps while it persists, so a stuck run is
reported without flooding the log. Missing metrics are ignored (an algorithm without a reference model has
no "kl"). All state is a plain dict (``state_dict`` / ``load_state_dict``) so a resumed run keeps its streaks.

Reward collapse is the one condition that is acted on, not only reported: :class:`CollapseGuard` smooths
the reward (a bias-corrected EMA; no best is recorded during its first 1 / (1 - smoothing) steps, so one
lucky early batch cannot set a bar that the run's true level then "collapses" below), remembers its best, and when the smoothed reward stays below ``collapse_fraction`` of
that best for ``collapse_patience`` steps it tells the trainer to restore the weights and optimizer state it
snapshotted at the best (``"restore"``) and to scale the LR by ``restore_lr_factor``; at most
``max_restores`` times per run. Its state is a plain dict too (the snapshot itself is saved by the trainer).

Metric vocabulary read: reward_mean, reward_std, zero_std_frac, truncated_frac, ratio_max, approx_kl, kl,
entropy, loss, grad_norm.
"""

from __future__ import annotations

import dataclasses
import logging
import math

from posttrain.config import check_fields, knob
from posttrain.trainers.guards import NonFiniteGuard

log = logging.getLogger("posttrain.alarms")


@dataclasses.dataclass
class AlarmConfig:
    reward_patience: int = knob(5, "steps in a row with identical rewards (or all groups uniform) before warning", ge=1)
    truncation_patience: int = knob(3, "steps in a row with every completion truncated before warning", ge=1)
    ratio_max_bound: float = knob(
        10.0, "warn when the largest importance ratio pi/pi_old exceeds this (inf = never)", gt=0, allow_inf=True
    )
    approx_kl_bound: float = knob(
        0.5, "warn when approx-KL(pi_old -> pi) per token exceeds this (nats; inf = never)", ge=0, allow_inf=True
    )
    kl_bound: float = knob(
        1.0, "warn when the KL to the reference per token exceeds this (nats; inf = never)", ge=0, allow_inf=True
    )
    entropy_floor: float = knob(0.05, "warn when the mean token entropy falls below this (nats): collapse", ge=0)
    entropy_patience: int = knob(3, "steps in a row below the entropy floor before warning", ge=1)
    repeat_every: int = knob(50, "while a condition persists, repeat its warning every this many steps", ge=1)
    collapse_fraction: float = knob(
        0.5,
        "reward collapse: restore the best weights when the smoothed reward stays below "
        "this fraction of its best (0 = off)",
        ge=0,
        lt=1,
    )
    collapse_patience: int = knob(20, "reward collapse: steps in a row below that fraction before restoring", ge=1)
    collapse_smoothing: float = knob(0.95, "reward collapse: EMA factor of the smoothed reward", ge=0, lt=1)
    collapse_min_reward: float = knob(0.1, "reward collapse: only a best smoothed reward above this can collapse", ge=0)
    max_restores: int = knob(3, "reward collapse: restores per run at most (then only warn)", ge=0)
    restore_lr_factor: float = knob(
        0.5, "reward collapse: multiply the learning rate by this at each restore", gt=0, le=1
    )

    def __post_init__(self):
        check_fields(self, "alarms.")


def _finite(x) -> bool:
    return x is not None and math.isfinite(float(x))


def _get(metrics: dict, key: str):
    v = metrics.get(key)
    return None if v is None else float(v)


# Each check: (metrics, config) -> (condition holds?, patience, message). None when its metrics are absent.
def _identical_rewards(m, c):
    std, mean = _get(m, "reward_std"), _get(m, "reward_mean")
    if std is None or not _finite(std):
        return None
    what = "all zero" if mean == 0.0 else f"all identical (mean {mean:.4g})" if mean is not None else "all identical"
    return (
        std == 0.0,
        c.reward_patience,
        f"rewards {what}: advantages are zero, nothing is learned; check the reward function and the answer column",
    )


def _uniform_groups(m, c):
    f = _get(m, "zero_std_frac")
    if f is None or _get(m, "reward_std") == 0.0:  # already reported as identical rewards
        return None
    return (
        f >= 1.0,
        c.reward_patience,
        "every group's rewards are uniform (zero_std_frac=1): the group baseline leaves no signal; the task may be too easy or too hard for G samples",
    )


def _truncation(m, c):
    f = _get(m, "truncated_frac")
    if f is None:
        return None
    return (
        f >= 1.0,
        c.truncation_patience,
        "every completion was truncated at the length limit: no EOS is produced; raise max_new_tokens or check the stop token",
    )


def _ratio(m, c):
    r = _get(m, "ratio_max")
    if r is None or not _finite(r):
        return None
    return (
        r > c.ratio_max_bound,
        1,
        f"importance ratio max {r:.4g} > {c.ratio_max_bound:g}: pi moved far from pi_old; lower the learning rate or the number of updates per batch",
    )


def _approx_kl(m, c):
    k = _get(m, "approx_kl")
    if k is None or not _finite(k):
        return None
    return (
        k > c.approx_kl_bound,
        1,
        f"approx-KL(pi_old -> pi) {k:.4g} > {c.approx_kl_bound:g} per token: updates too large",
    )


def _kl(m, c):
    k = _get(m, "kl")
    if k is None or not _finite(k):
        return None
    return (
        k > c.kl_bound,
        1,
        f"KL to the reference {k:.4g} > {c.kl_bound:g} per token: the policy is drifting; raise beta or use the adaptive controller",
    )


def _entropy(m, c):
    h = _get(m, "entropy")
    if h is None or not _finite(h):
        return None
    return (
        h < c.entropy_floor,
        c.entropy_patience,
        f"entropy collapse: mean token entropy {h:.4g} < {c.entropy_floor:g}; exploration has stopped",
    )


ALARM_CHECKS = {
    "identical_rewards": _identical_rewards,
    "uniform_groups": _uniform_groups,
    "all_truncated": _truncation,
    "ratio_bound": _ratio,
    "approx_kl_bound": _approx_kl,
    "kl_bound": _kl,
    "entropy_collapse": _entropy,
}

_NAN_KEYS = ("loss", "grad_norm")


class Alarms:
    """Feed it each step's metrics; read ``skip_step`` and ``should_stop`` after ``update``."""

    def __init__(self, config: AlarmConfig | None = None, nan_patience: int = 3):
        """``nan_patience``: consecutive non-finite steps (each skipped) before ``should_stop`` (the trainer's
        shared ``TrainerConfig.nan_patience``)."""
        self.config = config or AlarmConfig()
        self.streaks = {name: 0 for name in ALARM_CHECKS}
        self.fired = {name: 0 for name in [*ALARM_CHECKS, "non_finite"]}
        self.nan = NonFiniteGuard(nan_patience)  # the streak logic SFT/DPO/RM share
        self.skip_step = False
        self.should_stop = False

    @property
    def nan_streak(self) -> int:
        return self.nan.streak

    @property
    def skipped_steps(self) -> int:
        return self.nan.skipped

    def _due(self, streak: int, patience: int) -> bool:
        return streak == patience or (streak > patience and (streak - patience) % self.config.repeat_every == 0)

    def update(self, step: int, metrics: dict) -> list[str]:
        """Check one step's metrics; return its warnings (the trainer prints them, once, above its progress bar)."""
        out = []
        msg = self.nan.update(**{k: metrics[k] for k in _NAN_KEYS if k in metrics})
        self.skip_step = msg is not None
        if msg is not None:
            self.fired["non_finite"] += 1
            self.should_stop = self.should_stop or self.nan.should_stop
            out.append(msg)
        for name, check in ALARM_CHECKS.items():
            res = check(metrics, self.config)
            if res is None:
                continue
            holds, patience, msg = res
            self.streaks[name] = self.streaks[name] + 1 if holds else 0
            if holds and self._due(self.streaks[name], patience):
                self.fired[name] += 1
                n = self.streaks[name]
                out.append(msg + (f" ({n} steps in a row)" if n > 1 else ""))
        out = [f"ALARM step {step}: {m}" for m in out]
        for m in out:  # INFO, for a caller's own logging: the trainer prints them (a WARNING would print twice)
            log.info(m)
        return out

    def summary(self) -> dict:
        """How often each alarm fired, and how many steps were skipped (for summary.json)."""
        return {"alarms_fired": {k: v for k, v in self.fired.items() if v}, "skipped_steps": self.skipped_steps}

    def state_dict(self) -> dict:
        return {
            "streaks": dict(self.streaks),
            "fired": dict(self.fired),
            "nan_streak": self.nan_streak,
            "skipped_steps": self.skipped_steps,
            "should_stop": self.should_stop,
        }

    def load_state_dict(self, state: dict) -> None:
        self.streaks.update({k: int(v) for k, v in state["streaks"].items()})
        self.fired.update({k: int(v) for k, v in state["fired"].items()})
        self.nan.streak = int(state["nan_streak"])
        self.nan.skipped = int(state["skipped_steps"])
        self.should_stop = bool(state["should_stop"])
        self.skip_step = False


class CollapseGuard:
    """Smoothed-reward collapse detector. ``update(step, reward)`` -> "snapshot" (a new best: keep these
    weights), "restore" (collapsed: reload the snapshot, LR scaled down), "warn" (collapsed, restores used up)
    or None. Example (smoothing 0, fraction 0.5, patience 2): rewards .6 .2 .2 -> snapshot, None, restore."""

    def __init__(self, config: AlarmConfig | None = None, nan_patience: int = 3):
        """``nan_patience``: consecutive non-finite steps (each skipped) before ``should_stop`` (the trainer's
        shared ``TrainerConfig.nan_patience``)."""
        self.config = config or AlarmConfig()
        self.ema, self.best, self.best_step, self.below, self.restores, self.lr_scale = None, None, None, 0, 0, 1.0
        self.m, self.seen = 0.0, 0  # EMA numerator and the steps seen (bias correction, warm-up)

    def update(self, step: int, reward: float) -> str | None:
        c = self.config
        if not math.isfinite(reward):
            return None
        s = c.collapse_smoothing
        self.m, self.seen = s * self.m + (1 - s) * reward, self.seen + 1
        self.ema = self.m / (1 - s**self.seen)  # the mean of what was seen, while few steps were
        if self.seen < 1 / (1 - s) - 1e-9:
            return None  # warming up: the smoothed value is still mostly noise
        if self.best is None or self.ema > self.best:
            self.best, self.best_step, self.below = self.ema, step, 0
            return "snapshot"
        collapsed = (
            c.collapse_fraction > 0
            and self.best >= c.collapse_min_reward
            and self.ema < c.collapse_fraction * self.best
        )
        self.below = self.below + 1 if collapsed else 0
        if self.below < c.collapse_patience:
            return None
        self.below = 0
        if self.restores >= c.max_restores:
            return "warn"
        self.restores += 1
        self.lr_scale *= c.restore_lr_factor
        self.m, self.seen = self.best, 10**9  # the restored weights start from the best's smoothed value
        return "restore"

    def message(self, step: int, action: str) -> str:
        what = (
            f"restored the weights and optimizer of step {self.best_step}, LR x{self.lr_scale:g} "
            f"(restore {self.restores}/{self.config.max_restores})"
            if action == "restore"
            else "restores used up; training on"
        )
        return (
            f"ALARM step {step}: reward collapse: smoothed reward below {self.config.collapse_fraction:g} x its best "
            f"{self.best:.3f} for {self.config.collapse_patience} steps; {what}"
        )

    def state_dict(self) -> dict:
        return {
            "ema": self.ema,
            "best": self.best,
            "best_step": self.best_step,
            "below": self.below,
            "restores": self.restores,
            "lr_scale": self.lr_scale,
            "m": self.m,
            "seen": self.seen,
        }

    def load_state_dict(self, state: dict) -> None:
        for k in ("ema", "best", "best_step", "below", "restores", "lr_scale", "m", "seen"):
            setattr(self, k, state[k])


def watch_step(
    step: int,
    metrics: dict,
    alarms: Alarms,
    collapse: CollapseGuard,
    model,
    opt,
    snapshot: dict | None,
    reward: float | None,
    critic=None,
) -> dict | None:
    """After an RL step: the alarms, then the collapse guard on ``reward`` (None: not judged this step) -- a new
    best takes a snapshot of weights and optimizer, a collapse restores it (``restored_from``). Each warning is
    printed once above the progress bar and listed in ``metrics["alarms"]``. ``critic`` = (module, optimizer):
    PPO's value model, snapshotted and restored with the policy. Returns the (new) snapshot."""
    from posttrain.progress import tqdm
    from posttrain.trainers.checkpoint import restore_snapshot, take_snapshot

    warnings = alarms.update(step, metrics)
    action = collapse.update(step, reward) if reward is not None else None
    if action == "snapshot":
        snapshot = take_snapshot(model, opt, critic)
    elif action in ("restore", "warn"):
        if action == "restore" and snapshot is not None:
            restore_snapshot(model, opt, snapshot, critic)
            metrics["restored_from"] = collapse.best_step
        warnings.append(collapse.message(step, action))
    metrics["restores"] = collapse.restores
    for w in warnings:
        tqdm.write(w)  # every warning carries its "ALARM step N:" prefix
    if warnings:
        metrics["alarms"] = warnings
    return snapshot
