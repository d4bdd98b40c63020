import math

import pytest
import torch

from posttrain.losses.importance import truncated_is_weights


def test_hand_example_token_and_sequence_level():
    old = torch.tensor([[0.0, math.log(3.0), 5.0]])
    sampler = torch.zeros(1, 3)
    mask = torch.tensor([[1, 1, 0]])  # the third slot is padding: garbage there changes nothing
    w, m = truncated_is_weights(old, sampler, mask, cap=2.0, level="token")
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, 0.0]]))
    assert m["is_clipped_frac"] == 0.5 and m["is_weight_max"] == 2.0 and m["is_weight_min"] == 1.0
    assert m["sampling_logp_difference"] == pytest.approx(math.log(3.0) / 2)
    w, m = truncated_is_weights(old, sampler, mask, cap=2.0, level="sequence")  # exp(log 3) = 3 -> 2
    torch.testing.assert_close(w, torch.tensor([[2.0, 2.0, 0.0]]))
    w, _ = truncated_is_weights(old, sampler, mask, cap=10.0, level="sequence")
    torch.testing.assert_close(w, torch.tensor([[3.0, 3.0, 0.0]]))


def test_matched_engine_gives_weights_exactly_one_and_no_gradient():
    lp = torch.randn(4, 5, requires_grad=True)
    mask = (torch.rand(4, 5) > 0.3).long()
    w, m = truncated_is_weights(lp, lp.detach().clone(), mask)
    assert not w.requires_grad
    assert torch.equal(w, mask.float()) and m["is_weight_mean"] == 1.0 and m["sampling_logp_difference"] == 0.0


def test_bad_arguments():
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="cap must be >= 1"):
        truncated_is_weights(z, z, torch.ones(1, 2), cap=0.5)
    with pytest.raises(ValueError, match="level"):
        truncated_is_weights(z, z, torch.ones(1, 2), level="batch")
