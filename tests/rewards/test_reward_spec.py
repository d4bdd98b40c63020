"""How a trainer's ``reward`` spec and ``reward_model`` path combine (rewards/registry.py::resolve_reward_spec)."""

import pytest

from posttrain.errors import ConfigError
from posttrain.rewards.registry import build_reward, resolve_reward_spec
from posttrain.trainers.policy_gradient import PolicyGradientConfig

DEFAULT = "exact_match:1.0,digits:0.5"


@pytest.mark.parametrize(
    "spec, path, want",
    [
        (DEFAULT, "runs/rm", "reward_model:1.0"),  # --reward-model alone: the RM is the reward
        (DEFAULT, None, DEFAULT),  # no RM: nothing changes
        ("reward_model:1.0,format:0.1", "runs/rm", "reward_model:1.0,format:0.1"),  # a mix naming the RM: kept
        ("reward_model:1.0", "runs/rm", "reward_model:1.0"),  # idempotent (a resumed config resolves to itself)
    ],
)
def test_resolution(spec, path, want):
    assert resolve_reward_spec(spec, path, default=DEFAULT) == want


def test_errors_are_config_errors_naming_the_flags():
    with pytest.raises(
        ConfigError, match=r"^--reward 'reward_model' uses reward_model: pass --reward-model RM_CHECKPOINT"
    ):
        resolve_reward_spec("reward_model", None, default=DEFAULT)
    with pytest.raises(
        ConfigError, match=r"^--reward-model runs/rm is given but --reward 'exact_match' does not use it"
    ):
        resolve_reward_spec("exact_match", "runs/rm", default=DEFAULT)
    # build_reward applies the same check to whatever trainer calls it with rm_path (the PPO trainer too)
    with pytest.raises(ConfigError, match="pass --reward-model"):
        build_reward("reward_model:1.0,format:0.1", rm_path=None)
    with pytest.raises(ConfigError, match="does not use it"):
        build_reward("exact_match", rm_path="runs/rm")


def test_policy_gradient_config_resolves_at_construction():
    assert PolicyGradientConfig.reward == DEFAULT  # the rule keys on this default
    assert PolicyGradientConfig(reward_model="runs/rm").reward == "reward_model:1.0"
    assert (
        PolicyGradientConfig(reward_model="runs/rm", reward="reward_model:2,exact_match:1").reward
        == "reward_model:2,exact_match:1"
    )
    with pytest.raises(ConfigError, match="pass --reward-model"):
        PolicyGradientConfig(reward="reward_model")
    with pytest.raises(ConfigError, match="does not use it"):
        PolicyGradientConfig(reward="exact_match", reward_model="runs/rm")
