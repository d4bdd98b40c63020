"""Reward functions ``fn(prompts, completions, **columns) -> list[float]``: verifiers, sandbox, registry."""

from posttrain.rewards.registry import (
    REWARD_FUNCTIONS,
    RewardFunction,
    WeightedReward,
    build_reward,
    get_reward,
    parse_reward_spec,
    register_reward,
)
from posttrain.rewards.sandbox import SandboxResult, run_python
from posttrain.rewards.verifiers import (
    digits_reward,
    exact_match_reward,
    extract_answer,
    make_code_reward,
    make_format_reward,
    make_overlength_penalty,
    math_answer_reward,
    parse_math,
)

__all__ = [
    "REWARD_FUNCTIONS",
    "RewardFunction",
    "WeightedReward",
    "build_reward",
    "get_reward",
    "parse_reward_spec",
    "register_reward",
    "SandboxResult",
    "run_python",
    "digits_reward",
    "exact_match_reward",
    "extract_answer",
    "make_code_reward",
    "make_format_reward",
    "make_overlength_penalty",
    "math_answer_reward",
    "parse_math",
]
