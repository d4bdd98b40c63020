"""Each preference loss's LossSpec agrees with its function (the signature is the oracle, read only here)."""

import inspect

import pytest

from posttrain.config import ConfigError
from posttrain.losses.preference import LOSS_SPECS, resolve_loss
from posttrain.trainers.dpo import check_loss_kwargs

PROVIDED = {"policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps", "ref_rejected_logps", "policy_logps",
            "ref_logps", "labels", "policy_kl_logps", "ref_kl_logps", "kl", "beta", "state", "generator"}


@pytest.mark.parametrize("name", sorted(LOSS_SPECS))
def test_spec_matches_the_function(name):
    spec = LOSS_SPECS[name]
    params = inspect.signature(spec.fn).parameters
    assert set(spec.options) == set(params) - PROVIDED - set(spec.extras), name
    assert set(spec.extras) <= set(params), name
    assert params["beta"].default == spec.default_beta, name
    assert ("state" in params) == (spec.state is not None), name
    assert ("generator" in params) == spec.generator, name


def test_combined_options_check_every_component_domain():
    choice = resolve_loss("cdpo,robust")
    assert choice.options == {"label_smoothing": {"cdpo": {"ge": 0, "le": 0.5}, "robust": {"ge": 0, "lt": 0.5}}}
    check_loss_kwargs("cdpo,robust", {"label_smoothing": 0.2})
    with pytest.raises(ConfigError, match=r"label_smoothing=0\.5 must be in \[0, 0\.5\) \(loss 'cdpo,robust'\)"):
        check_loss_kwargs("cdpo,robust", {"label_smoothing": 0.5})  # inside cDPO's domain, outside robust's
    assert resolve_loss("simpo,sft").default_beta == 2.0 and resolve_loss("sft,simpo").default_beta == 0.1
    assert resolve_loss("beta_dpo").generator and not resolve_loss("dpo").generator
