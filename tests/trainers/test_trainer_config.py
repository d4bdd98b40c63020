"""The shared trainer fields are declared once (TrainerConfig) and every trainer config includes them."""

import dataclasses

import pytest

from posttrain.config import ConfigError
from posttrain.trainers.dpo import DPOConfig
from posttrain.trainers.policy_gradient import PolicyGradientConfig
from posttrain.trainers.ppo import PPOConfig
from posttrain.trainers.reward import RMConfig
from posttrain.trainers.sft import SFTConfig
from posttrain.trainers.trainer_config import TrainerConfig, override

CONFIGS = [SFTConfig, RMConfig, DPOConfig, PolicyGradientConfig, PPOConfig]
SHARED = {f.name: f for f in dataclasses.fields(TrainerConfig)}


@pytest.mark.parametrize("cls", CONFIGS)
def test_every_trainer_includes_the_shared_fields_with_their_bounds(cls):
    assert issubclass(cls, TrainerConfig)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name, f in SHARED.items():
        # an override may change the default and the help text, never the bounds or the choices
        assert fields[name].metadata.get("bounds") == f.metadata.get("bounds"), (cls.__name__, name)
        assert fields[name].metadata.get("choices") == f.metadata.get("choices"), (cls.__name__, name)


@pytest.mark.parametrize("cls", CONFIGS)
def test_shared_bounds_are_checked_in_every_trainer(cls):
    with pytest.raises(ConfigError, match=r"lr=-1\.0 must be > 0"):
        cls(lr=-1.0)
    with pytest.raises(ConfigError, match="nan_patience=0 must be >= 1"):
        cls(nan_patience=0)


def test_override_keeps_metadata_and_rejects_unknown_names():
    f = override("lr", 5.0)
    assert f.default == 5.0 and f.metadata["bounds"] == {"gt": 0}
    assert f.metadata["help"] == SHARED["lr"].metadata["help"]
    assert override("lr", 5.0, "more specific").metadata["help"] == "more specific"
    with pytest.raises(KeyError, match="not a TrainerConfig field"):
        override("batch_size", 8)
