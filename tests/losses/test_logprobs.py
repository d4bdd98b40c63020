import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.losses.logprobs import masked_mean, masked_whiten, sequence_logps, token_logps, warp_logits


def test_top_p_worked_example():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    kept = torch.isfinite(warp_logits(logits, top_p=0.7))
    assert kept.tolist() == [True, True, False]
    assert torch.isfinite(warp_logits(logits, top_p=0.5)).tolist() == [True, False, False]
    assert torch.isfinite(warp_logits(logits, top_p=0.01)).tolist() == [True, False, False]


def test_top_k_and_temperature():
    logits = torch.tensor([1.0, 3.0, 2.0, 0.0])
    w = warp_logits(logits, temperature=2.0, top_k=2)
    assert torch.isinf(w[[0, 3]]).all() and torch.allclose(w[[1, 2]], torch.tensor([1.5, 1.0]))


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 12), st.floats(0.05, 1.0), st.integers(0, 10_000))
def test_top_p_keeps_minimal_nucleus(v, p, seed):
    logits = torch.randn(v, generator=torch.Generator().manual_seed(seed))
    kept = torch.isfinite(warp_logits(logits, top_p=p))
    probs = logits.softmax(-1)
    assert kept[probs.argmax()]
    assert probs[kept].sum() >= p - 1e-6  # the nucleus reaches p
    smallest_kept = probs[kept].min()
    assert probs[kept].sum() - smallest_kept < p + 1e-6  # and is minimal


def test_token_logps_matches_cross_entropy():
    logits, labels = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    ref = -F.cross_entropy(logits.reshape(-1, 7), labels.reshape(-1), reduction="none").reshape(2, 5)
    torch.testing.assert_close(token_logps(logits, labels), ref)


def test_masked_reductions():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert masked_mean(x, m) == 1.5
    assert masked_mean(x, m, dim=1).tolist() == [1.5, 0.0]  # empty row -> 0, not NaN
    assert sequence_logps(x, m).tolist() == [3.0, 0.0]
    assert sequence_logps(x, m, average=True).tolist() == [1.5, 0.0]
    w = masked_whiten(torch.tensor([1.0, 2.0, 3.0, 100.0]), torch.tensor([1, 1, 1, 0]))
    assert abs(float(w[:3].mean())) < 1e-6
