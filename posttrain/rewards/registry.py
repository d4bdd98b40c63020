"""Reward functions by name, and their weighted sum.

Key insight: a reward is a plain function ``fn(prompts, completions, **columns) -> list[float]``; the trainer
only ever sees one such function, the weighted sum ``R = sum_k w_k * fn_k``, and logs each component.

``REWARD_FUNCTIONS`` maps a name to a *factory* taking keyword options (unknown options are ignored, so one
options dict can serve several rewards) and returning the reward function:

    REWARD_FUNCTIONS["math"]()                                  -> math_answer_reward
    REWARD_FUNCTIONS["overlength"](max_length=64, buffer=16)     -> a DAPO over-length penalty
    build_reward("math:1.0,format:0.1")                          -> WeightedReward

``reward_model`` (a ``posttrain rm`` checkpoint, ``rm_path=DIR``) is listed here like the others; its module
(:mod:`posttrain.rewards.reward_model`: torch, a checkpoint reader) is imported only when it is built, and
built once per :func:`build_reward` call (one RM load per run). How a trainer config's ``reward`` spec and
``reward_model`` path combine is :func:`resolve_reward_spec` (the same rule for every RL trainer):

    resolve_reward_spec(DEFAULT, "runs/rm", default=DEFAULT)       -> "reward_model:1.0"
    resolve_reward_spec("reward_model:1.0,format:0.1", "runs/rm")  -> unchanged
    resolve_reward_spec("reward_model", None)                      -> ConfigError (no path)
    resolve_reward_spec("exact_match", "runs/rm")                  -> ConfigError (the RM would be ignored)
"""

from __future__ import annotations

import math
from typing import Callable, Protocol

from posttrain.errors import ConfigError, UserError
from posttrain.rewards.verifiers import (
    digits_reward,
    exact_match_reward,
    make_code_reward,
    make_format_reward,
    make_overlength_penalty,
    math_answer_reward,
)


class RewardFunction(Protocol):
    def __call__(self, prompts: list[str], completions: list[str], **columns) -> list[float]: ...


def _exact_match(**_):
    return exact_match_reward


def _digits(**_):
    return digits_reward


def _math(backend: str = "auto", **_):
    if backend == "auto":
        return math_answer_reward

    def math_reward(prompts, completions, **columns):
        return math_answer_reward(prompts, completions, **{**columns, "backend": backend})

    return math_reward


def _reward_model(**options):
    from posttrain.rewards.reward_model import reward_model_reward  # lazy: torch and a checkpoint reader

    return reward_model_reward(**options)


REWARD_FUNCTIONS: dict[str, Callable[..., RewardFunction]] = {
    "exact_match": _exact_match,
    "digits": _digits,
    "math": _math,
    "format": make_format_reward,
    "overlength": make_overlength_penalty,
    "code": make_code_reward,
    "reward_model": _reward_model,
}


def register_reward(name: str, factory: Callable[..., RewardFunction]) -> None:
    """Add a reward factory under ``name`` (e.g. the reward-model reward); refuses to overwrite silently."""
    if name in REWARD_FUNCTIONS and REWARD_FUNCTIONS[name] is not factory:
        raise ValueError(f"a reward named {name!r} is already registered")
    REWARD_FUNCTIONS[name] = factory


def get_reward(name: str, **options) -> RewardFunction:
    if name not in REWARD_FUNCTIONS:
        raise ConfigError(f"unknown reward {name!r}; choose from: {', '.join(sorted(REWARD_FUNCTIONS))}")
    return REWARD_FUNCTIONS[name](**options)


class WeightedReward:
    """R = sum_k w_k * fn_k(prompts, completions, **columns); also a reward function itself.

    ``components`` returns the total and each named component (for per-reward metrics). Each component
    must return one finite float per completion, or a UserError says which reward broke the contract.
    """

    def __init__(self, terms: dict[str, tuple[RewardFunction, float]]):
        if not terms:
            raise ConfigError("at least one reward function is needed")
        self.terms = dict(terms)

    def components(self, prompts: list[str], completions: list[str], **columns):
        if len(prompts) != len(completions):
            raise UserError(f"{len(prompts)} prompts for {len(completions)} completions")
        total = [0.0] * len(completions)
        parts = {}
        for name, (fn, weight) in self.terms.items():
            values = [float(v) for v in fn(prompts, completions, **columns)]
            if len(values) != len(completions):
                raise UserError(f"reward {name!r} returned {len(values)} values for {len(completions)} completions")
            if not all(math.isfinite(v) for v in values):
                raise UserError(f"reward {name!r} returned a non-finite value")
            parts[name] = values
            total = [t + weight * v for t, v in zip(total, values)]
        return total, parts

    def __call__(self, prompts: list[str], completions: list[str], **columns) -> list[float]:
        return self.components(prompts, completions, **columns)[0]


def parse_reward_spec(spec: str) -> dict[str, float]:
    """"math:1.0, format:0.1" -> {"math": 1.0, "format": 0.1}; a bare name has weight 1."""
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, w = item.partition(":")
        name = name.strip()
        try:
            out[name] = float(w) if w.strip() else 1.0
        except ValueError:
            raise ConfigError(f"reward weight {w!r} for {name!r} is not a number (spec: {spec!r})") from None
        if name not in REWARD_FUNCTIONS:
            raise ConfigError(f"unknown reward {name!r}; choose from: {', '.join(sorted(REWARD_FUNCTIONS))}")
    if not out:
        raise ConfigError(f"empty reward spec {spec!r}; e.g. 'exact_match:1.0'")
    return out


RM_REWARD = "reward_model"


def resolve_reward_spec(spec: str, rm_path: str | None, default: str | None = None) -> str:
    """The reward spec a run uses, given its ``reward`` and ``reward_model`` fields (checked at config time).

    A reward-model path with the spec left at the trainer's ``default`` means ``reward_model:1.0``; any other
    spec must name ``reward_model`` itself when a path is given (else the RM would be loaded and ignored), and
    a spec naming ``reward_model`` needs a path. Idempotent: a resolved spec resolves to itself (resume).
    """
    weights = parse_reward_spec(spec)
    if rm_path and RM_REWARD not in weights:
        if default is not None and spec == default:
            return f"{RM_REWARD}:1.0"
        raise ConfigError(f"--reward-model {rm_path} is given but --reward {spec!r} does not use it: add "
                          f"'{RM_REWARD}:W' to the spec (e.g. '{RM_REWARD}:1.0,{spec}') or drop --reward")
    if RM_REWARD in weights and not rm_path:
        raise ConfigError(f"--reward {spec!r} uses {RM_REWARD}: pass --reward-model RM_CHECKPOINT (a `posttrain rm` "
                          "output directory)")
    return spec


def build_reward(spec: str | dict[str, float], **options) -> WeightedReward:
    """A weighted reward from a spec string or {name: weight}; ``options`` go to every factory.

    With ``rm_path`` (``build_reward(cfg.reward, rm_path=cfg.reward_model)``) the spec is checked by
    :func:`resolve_reward_spec` (no default substitution here: configs resolve that in ``__post_init__``); the
    reward model is loaded once, here, and its scorer reused for every call.
    """
    weights = parse_reward_spec(spec) if isinstance(spec, str) else dict(spec)
    if "rm_path" in options:
        resolve_reward_spec(",".join(f"{k}:{w}" for k, w in weights.items()), options["rm_path"])
    return WeightedReward({name: (get_reward(name, **options), w) for name, w in weights.items()})
