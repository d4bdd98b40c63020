"""Each preference loss's LossSpec agrees with its function (the signature is the oracle, read only here)."""

import inspect

import pytest
import torch

from posttrain.config import ConfigError
from posttrain.losses.preference import LOSS_SPECS, resolve_loss
from posttrain.trainers.dpo_config import check_loss_kwargs

PROVIDED = {
    "policy_chosen_logps",
    "policy_rejected_logps",
    "ref_chosen_logps",
    "ref_rejected_logps",
    "policy_logps",
    "ref_logps",
    "labels",
    "policy_kl_logps",
    "ref_kl_logps",
    "kl",
    "beta",
    "state",
    "generator",
}


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


def _paired_inputs(B, gen):
    r = lambda: -torch.rand(B, generator=gen, dtype=torch.float64) * 10  # noqa: E731
    lengths = torch.randint(1, 9, (B,), generator=gen).double()
    kw = dict(
        policy_chosen_logps=r(),
        policy_rejected_logps=r(),
        ref_chosen_logps=r(),
        ref_rejected_logps=r(),
        chosen_lengths=lengths,
        rejected_lengths=torch.randint(1, 9, (B,), generator=gen).double(),
    )
    kw["chosen_nll"] = -kw["policy_chosen_logps"] / lengths
    return kw


def _call(name, kw):
    spec = LOSS_SPECS[name]
    params = inspect.signature(spec.fn).parameters
    args = {k: v for k, v in kw.items() if k in params}
    if spec.state is not None:
        args["state"] = None
    if spec.generator:
        args["generator"] = torch.Generator().manual_seed(0)
    return spec.fn(**args)[0]


@pytest.mark.parametrize("name", sorted(n for n, s in LOSS_SPECS.items() if not s.unpaired))
def test_batch_coupled_is_declared_exactly_for_losses_that_are_not_pair_means(name):
    """A loss that is a mean of per-pair terms splits over processes: L(A u B) = (|A| L(A) + |B| L(B)) / (|A| + |B|)
    (what the trainers' world-size invariance relies on); a batch-coupled one (declared so) does not."""
    gen = torch.Generator().manual_seed(7)
    a, b = _paired_inputs(5, gen), _paired_inputs(3, gen)
    both = {k: torch.cat([a[k], b[k]]) for k in a}
    whole, parts = _call(name, both), (5 * _call(name, a) + 3 * _call(name, b)) / 8
    splits = torch.isclose(whole, parts, atol=1e-9, rtol=1e-9).item()
    assert splits != LOSS_SPECS[name].batch_coupled, (name, whole.item(), parts.item())
