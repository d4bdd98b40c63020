"""GRESO pre-rollout filtering: P(sample) = p ** z per candidate, a round's prompts from its pool, the history."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import UserError
from posttrain.trainers.rl.prompt_filter import PromptHistory, sample_mask, select


def test_sample_mask_keeps_with_probability_p_to_the_streak():
    streak = torch.tensor([0, 1, 2, 3] * 20000)
    ok = sample_mask(streak, 0.5, torch.Generator().manual_seed(0)).view(-1, 4).double().mean(0)
    torch.testing.assert_close(ok, torch.tensor([1.0, 0.5, 0.25, 0.125], dtype=torch.float64), atol=0.01, rtol=0)
    assert sample_mask(torch.full((100,), 7), 1.0, torch.Generator().manual_seed(1)).all()  # p = 1: no filter


@settings(max_examples=200, deadline=None)
@given(
    streaks=st.lists(st.integers(0, 6), min_size=1, max_size=40),
    want=st.integers(1, 10),
    p=st.floats(0.05, 1.0),
    seed=st.integers(0, 2**31),
)
def test_select_takes_the_first_passing_then_fills_with_the_skipped(streaks, want, p, seed):
    streak = torch.tensor(streaks)
    pool = torch.randperm(len(streaks), generator=torch.Generator().manual_seed(seed))
    if len(pool) < want:
        with pytest.raises(ValueError):
            select(pool, streak, p, want, torch.Generator().manual_seed(seed))
        return
    chosen, rate = select(pool, streak, p, want, torch.Generator().manual_seed(seed))
    ok = sample_mask(streak[pool], p, torch.Generator().manual_seed(seed))  # the same draws
    expect = [int(i) for i, k in zip(pool, ok) if k][:want]
    expect += [int(i) for i, k in zip(pool, ok) if not k][: want - len(expect)]
    assert chosen.tolist() == expect and len(set(expect)) == want
    assert rate == pytest.approx(ok.double().mean().item())
    assert all(k for i, k in zip(pool.tolist(), ok) if streak[i] == 0)  # z = 0 is always sampled


@settings(max_examples=100, deadline=None)
@given(streaks=st.lists(st.integers(0, 6), min_size=1, max_size=40), want=st.integers(1, 10), seed=st.integers(0, 99))
def test_select_without_fill_takes_only_the_passing(streaks, want, seed):
    streak = torch.tensor(streaks)
    pool = torch.randperm(len(streaks), generator=torch.Generator().manual_seed(seed))
    if len(pool) < want:
        return
    chosen, _ = select(pool, streak, 0.5, want, torch.Generator().manual_seed(seed), fill=False)
    filled, _ = select(pool, streak, 0.5, want, torch.Generator().manual_seed(seed))
    ok = sample_mask(streak[pool], 0.5, torch.Generator().manual_seed(seed))
    assert chosen.tolist() == [int(i) for i, k in zip(pool, ok) if k][:want]  # possibly fewer than want, or none
    assert filled[: len(chosen)].tolist() == chosen.tolist()  # the filled round starts with the same prompts


def test_history_counts_uninformative_rollouts_in_a_row_and_round_trips():
    h = PromptHistory(6)
    h.update(torch.tensor([0, 1, 2]), torch.tensor([True, True, False]))
    h.update(torch.tensor([0, 1, 5]), torch.tensor([True, False, True]))
    assert h.streak.tolist() == [2, 0, 0, 0, 0, 1]
    g = PromptHistory(6)
    g.streak.fill_(9)
    g.load_state_dict(h.state_dict())
    assert torch.equal(g.streak, h.streak)
    with pytest.raises(UserError, match="has 6 prompts, the data 7"):
        PromptHistory(7).load_state_dict(h.state_dict())
