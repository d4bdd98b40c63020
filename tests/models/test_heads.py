"""Reward heads: last-real-token indexing, padding invariance on HF GPT-2 and our GPT, stats, best-of-N, ensembles."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import DataError
from posttrain.models.heads import (
    REWARD_STATS_FILE,
    Backbone,
    HFBackbone,
    RewardEnsemble,
    RewardModel,
    RewardStats,
    ScalarHead,
    as_backbone,
    best_of_n,
    combine_rewards,
    last_token_index,
    positions_from_mask,
    reward_stats_over,
    weighted_best_of_n,
)


def test_last_token_index_left_right_and_holes():
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0], [1, 0, 1, 0], [1, 1, 1, 1]])
    assert last_token_index(mask).tolist() == [3, 2, 2, 3]
    with pytest.raises(ValueError, match="no real token"):
        last_token_index(torch.tensor([[0, 0]]))
    assert positions_from_mask(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0]])).tolist() == [[0, 0, 0, 1], [0, 1, 2, 2]]


def test_scalar_head_reads_the_last_real_token():
    head = ScalarHead(3)
    with torch.no_grad():
        head.proj.weight.copy_(torch.tensor([[1.0, 10.0, 100.0]]))
        head.proj.bias.fill_(0.5)
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).view(2, 4, 3)  # (B=2, T=4, D=3)
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]])
    # row 0 reads t=1: h = [3, 4, 5] -> 3 + 40 + 500 + 0.5; row 1 reads t=3: h = [21, 22, 23] -> 21 + 220 + 2300 + 0.5
    assert head(hidden, mask).tolist() == [543.5, 2541.5]


def _pad(seqs, side, pad_id=0):
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        sl = slice(T - len(s), T) if side == "left" else slice(0, len(s))
        ids[i, sl] = torch.tensor(s)
        mask[i, sl] = 1
    return ids, mask


SEQS = [[5, 9, 3, 7, 1], [4, 2], [8, 8, 8, 1, 2, 3, 4], [11]]


@pytest.fixture(scope="module")
def hf_gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=32)
    return transformers.GPT2LMHeadModel(cfg).eval()


def test_hf_rewards_identical_under_left_and_right_padding(hf_gpt2):
    rm = RewardModel(hf_gpt2).eval()
    assert isinstance(rm.backbone, HFBackbone) and isinstance(rm.backbone, Backbone)
    with torch.no_grad():
        left = rm(*_pad(SEQS, "left"))
        right = rm(*_pad(SEQS, "right"))
        single = torch.cat([rm(torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long)) for s in SEQS])
    torch.testing.assert_close(left, right, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(left, single, atol=1e-5, rtol=1e-5)  # padding changes nothing at all
    assert left.shape == (len(SEQS),) and left.std() > 0  # distinct sequences, distinct rewards


def test_hf_backbone_is_the_last_hidden_state_of_the_lm(hf_gpt2):
    ids, mask = _pad(SEQS, "right")
    pos = positions_from_mask(mask)
    with torch.no_grad():
        ours = HFBackbone(hf_gpt2)(ids, mask, pos)
        ref = hf_gpt2(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True).hidden_states[-1]
    torch.testing.assert_close(ours, ref)


def test_our_gpt_rewards_identical_under_left_and_right_padding():
    from posttrain.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=50, n_layer=2, n_head=2, d_model=32, max_seq_len=16)).eval()
    rm = RewardModel(gpt).eval()
    with torch.no_grad():
        left, right = rm(*_pad(SEQS, "left")), rm(*_pad(SEQS, "right"))
    torch.testing.assert_close(left, right, atol=1e-5, rtol=1e-5)


def test_reward_model_gradients_reach_backbone_and_head(hf_gpt2):
    import copy

    rm = RewardModel(copy.deepcopy(hf_gpt2))
    rm(*_pad(SEQS, "left")).sum().backward()
    assert rm.head.proj.weight.grad.abs().sum() > 0
    assert rm.backbone.model.transformer.h[0].attn.c_attn.weight.grad.abs().sum() > 0
    assert rm.backbone.model.lm_head.weight.grad is not None  # tied to wte, which the backbone does use


class _ToyBackbone(nn.Module):
    """The smallest module satisfying the Backbone protocol: an embedding."""

    def __init__(self):
        super().__init__()
        self.hidden_size = 4
        self.emb = nn.Embedding(20, 4)

    def forward(self, input_ids, attention_mask, position_ids):
        return self.emb(input_ids)


def test_custom_backbone_protocol_and_bad_backbone():
    toy = _ToyBackbone()
    assert as_backbone(toy) is toy
    rm = RewardModel(toy)
    ids, mask = _pad([[1, 2, 3], [4]], "left")
    assert rm(ids, mask).shape == (2,)
    with pytest.raises(TypeError, match="not a backbone"):
        as_backbone(nn.Linear(3, 3))


def test_reward_stats_roundtrip_and_normalize(tmp_path):
    s = RewardStats.from_rewards(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert s.mean == pytest.approx(2.5) and s.std == pytest.approx(1.2909944)  # unbiased std of 1..4
    assert s.count == 4
    path = s.save(tmp_path)  # a directory gets reward_stats.json
    assert path == tmp_path / REWARD_STATS_FILE
    assert json.loads(path.read_text()) == {"mean": s.mean, "std": s.std, "count": 4}
    assert RewardStats.load(tmp_path) == s
    z = s.normalize(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert z.mean().item() == pytest.approx(0.0, abs=1e-6) and z.std().item() == pytest.approx(1.0)
    (tmp_path / "bad.json").write_text('{"mean": 1}')
    with pytest.raises(DataError, match="bad.json"):
        RewardStats.load(tmp_path / "bad.json")
    with pytest.raises(DataError, match="not found"):
        RewardStats.load(tmp_path / "missing.json")


def test_reward_stats_over_a_prompt_set_in_batches():
    rm = RewardModel(_ToyBackbone())
    ids, mask = _pad([[1, 2], [3], [4, 5, 6], [7], [8, 9]], "right")
    rm.train()
    stats = reward_stats_over(rm, ids, mask, batch_size=2)
    assert rm.training  # mode restored
    with torch.no_grad():
        direct = RewardStats.from_rewards(rm(ids, mask))
    assert stats.mean == pytest.approx(direct.mean, abs=1e-6) and stats.std == pytest.approx(direct.std, abs=1e-6)


def test_best_of_n():
    idx, best = best_of_n(torch.tensor([1.0, 3.0, 2.0, 0.0, 5.0, 5.0]), n=3)
    assert idx.tolist() == [1, 4] and best.tolist() == [3.0, 5.0]  # tie -> first
    with pytest.raises(ValueError):
        best_of_n(torch.tensor([1.0, 2.0, 3.0]), n=2)


def _weighted_oracle(rewards, answers, n):
    """Brute force in plain Python floats: exp-weights per group, totals per answer, first max, best member."""
    import math

    picks = []
    for b in range(len(rewards) // n):
        grp = range(b * n, (b + 1) * n)
        z = sum(math.exp(rewards[i] - max(rewards[j] for j in grp)) for i in grp)
        tot = {}
        for i in grp:
            tot[answers[i]] = tot.get(answers[i], 0.0) + math.exp(rewards[i] - max(rewards[j] for j in grp)) / z
        order = [answers[i] for i in grp]
        top = max(tot.values())
        win = min((a for a in tot if tot[a] >= top - 1e-12), key=order.index)
        picks.append(max((i for i in grp if answers[i] == win), key=lambda i: (rewards[i], -i)))
    return picks


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.lists(
                st.tuples(st.sampled_from([-2.0, -0.5, 0.0, 0.5, 1.0, 3.0]), st.sampled_from("abc")),
                min_size=n,
                max_size=4 * n,
            ).filter(lambda xs: len(xs) % n == 0),
        )
    )
)
def test_weighted_best_of_n_matches_brute_force(case):
    n, rows = case
    rewards, answers = [r for r, _ in rows], [a for _, a in rows]
    got = weighted_best_of_n(torch.tensor(rewards), answers, n).tolist()
    assert got == _weighted_oracle(rewards, answers, n)


def test_weighted_best_of_n_properties():
    # the docstring's example: "8" pools .26 + .26 + .06 > .43, where plain best-of-N takes the lone "7"
    r = torch.tensor([2.0, 1.5, 1.5, 0.0])
    assert weighted_best_of_n(r, ["7", "8", "8", "8"], 4).tolist() == [1] and best_of_n(r, 4)[0].tolist() == [0]
    # one sample per answer: the same picks as best_of_n
    g = torch.Generator().manual_seed(0)
    r = torch.randn(24, generator=g)
    assert weighted_best_of_n(r, [str(i) for i in range(24)], 6).tolist() == best_of_n(r, 6)[0].tolist()
    # equal scores: a majority vote, the majority's first sample
    assert weighted_best_of_n(torch.zeros(5), ["1", "2", "2", "1", "2"], 5).tolist() == [1]
    with pytest.raises(ValueError):
        weighted_best_of_n(torch.zeros(4), ["a"] * 3, 2)


def test_combine_rewards_weighted_and_zscored():
    comps = {"help": torch.tensor([1.0, 2.0]), "safe": torch.tensor([0.0, 4.0])}
    w = {"help": 1.0, "safe": 0.5}
    assert combine_rewards(comps, w).tolist() == [1.0, 4.0]
    stats = {"help": RewardStats(1.0, 2.0, 10), "safe": RewardStats(2.0, 1.0, 10)}
    # z: help [0, 0.5], safe [-2, 2] -> [0 - 1, 0.5 + 1] = [-1, 1.5]
    assert combine_rewards(comps, w, stats).tolist() == [-1.0, 1.5]
    with pytest.raises(ValueError, match="weights"):
        combine_rewards(comps, {"help": 1.0})


def test_reward_ensemble_matches_manual_combination():
    torch.manual_seed(0)
    a, b = RewardModel(_ToyBackbone()), RewardModel(_ToyBackbone())
    ens = RewardEnsemble({"a": a, "b": b}, {"a": 0.3, "b": -1.0})
    ids, mask = _pad([[1, 2], [3, 4, 5]], "left")
    with torch.no_grad():
        torch.testing.assert_close(ens(ids, mask), 0.3 * a(ids, mask) - b(ids, mask))
    assert set(ens.components(ids, mask)) == {"a", "b"}


def test_hf_encoder_backbone_left_right_padding():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    rm = RewardModel(transformers.BertModel(cfg)).eval()
    assert rm.backbone.takes_position_ids
    with torch.no_grad():
        torch.testing.assert_close(rm(*_pad(SEQS, "left")), rm(*_pad(SEQS, "right")), atol=1e-5, rtol=1e-5)
