import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import ConfigError
from posttrain.generate import SamplingConfig, generate, left_pad
from posttrain.scoring import completion_logps

PROMPTS = [[1, 5, 6, 14, 7, 8, 16], [1, 9, 16], [1, 5, 5, 5]]


def test_left_pad():
    ids, mask = left_pad([[5, 6], [7]], pad_id=0)
    assert ids.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]
    with pytest.raises(ValueError):
        left_pad([[]], 0)


def test_greedy_cache_equals_no_cache(tiny_gpt):
    cfg = SamplingConfig(max_new_tokens=10, temperature=0)
    a = generate(tiny_gpt, PROMPTS, pad_id=0, eos_id=2, cfg=cfg)
    b = generate(tiny_gpt, PROMPTS, pad_id=0, eos_id=2, cfg=cfg, use_cache=False)
    assert torch.equal(a.sequences, b.sequences)
    torch.testing.assert_close(a.logps, b.logps, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, None, None), (0.7, None, None), (1.3, 5, None), (1.0, 4, None), (0.9, None, 0.8), (0.6, 6, 0.9)],
)
def test_sampling_logps_equal_recomputed(tiny_gpt, temperature, top_k, top_p):
    cfg = SamplingConfig(max_new_tokens=8, temperature=temperature, top_k=top_k, top_p=top_p, num_samples=4)
    g = generate(tiny_gpt, PROMPTS, pad_id=0, eos_id=2, cfg=cfg, generator=torch.Generator().manual_seed(0))
    lp = completion_logps(
        tiny_gpt,
        g.sequences,
        g.attention_mask,
        g.prompt_length,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        completion_mask=g.completion_mask,
    )
    torch.testing.assert_close(lp, g.logps, atol=1e-5, rtol=1e-5)
    raw = completion_logps(tiny_gpt, g.sequences, g.attention_mask, g.prompt_length, completion_mask=g.completion_mask)
    torch.testing.assert_close(raw, g.raw_logps, atol=1e-5, rtol=1e-5)
    if (top_k or top_p) and temperature == 1.0:  # truncation renormalises: sampled tokens' log-probs rise
        assert (g.logps >= g.raw_logps - 1e-6).all()


def test_top_k_support(tiny_gpt):
    """Every sampled token is among the k most likely under the model at that step."""
    cfg = SamplingConfig(max_new_tokens=5, temperature=1.0, top_k=2, num_samples=8)
    g = generate(tiny_gpt, PROMPTS, pad_id=0, eos_id=None, cfg=cfg, generator=torch.Generator().manual_seed(1))
    logits = tiny_gpt(g.sequences, attention_mask=g.attention_mask, position_ids=g.position_ids).logits
    step_logits = logits[:, g.prompt_length - 1 : -1]
    top2 = step_logits.topk(2, dim=-1).indices
    assert (top2 == g.completion_ids[..., None]).any(-1).all()


class _EosAfter16(torch.nn.Module):
    """Wraps a model so EOS (id 2) is certain right after token 16 and impossible elsewhere."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, cache=None, **kw):
        out = self.inner(input_ids, cache=cache, **kw)
        out.logits[..., 2] = torch.where(input_ids == 16, 100.0, -100.0)
        return out


def test_eos_stops_and_masks(tiny_gpt):
    """Rows 0 and 1 end on EOS at the first step; row 2 runs to the limit and is marked truncated."""
    g = generate(
        _EosAfter16(tiny_gpt), PROMPTS, pad_id=0, eos_id=2, cfg=SamplingConfig(max_new_tokens=5, temperature=0)
    )
    assert g.completion_ids[:2, 0].tolist() == [2, 2]
    assert g.completion_mask.tolist()[:2] == [[1, 0, 0, 0, 0]] * 2 and g.completion_mask[2].all()
    assert (g.completion_ids[:2, 1:] == 0).all()  # padded after EOS
    assert g.truncated.tolist() == [False, False, True]
    assert g.logps[:2, 1:].abs().sum() == 0


class _EosBoost(torch.nn.Module):
    """Wraps a model so EOS (id 2) is likely at every step (rows end at different steps) and records the rows of
    each forward pass."""

    def __init__(self, inner, boost: float, at_position: int | None = None):
        super().__init__()
        self.inner, self.boost, self.at, self.rows = inner, boost, at_position, []

    def forward(self, input_ids, cache=None, **kw):
        self.rows.append(input_ids.shape[0])
        out = self.inner(input_ids, cache=cache, **kw)
        out.logits[..., 2] += self.boost
        if self.at is not None:  # EOS certain from this position on: rows of other prompt lengths end apart
            out.logits[..., 2] = torch.where(kw["position_ids"] >= self.at, 100.0, out.logits[..., 2])
        return out


NINE = [*PROMPTS, [1, 3], [1, 4, 4], [1, 7, 8, 9, 10, 11], [1, 12], [1, 13, 3, 3, 3], [1, 6, 6]]


@pytest.mark.parametrize("temperature,boost,at", [(1.0, 2.0, None), (0.0, 0.0, 8), (1.0, 6.0, None)])
def test_dropping_finished_rows_changes_nothing(tiny_gpt, temperature, boost, at):
    """Rows that have emitted EOS leave the forward passes: the same tokens and log-probs as running every row to
    the end (the sampler still draws for all rows, so the RNG stream is the same); at least 4 rows stay."""
    cfg = SamplingConfig(max_new_tokens=8, temperature=temperature, num_samples=4)
    runs = {}
    for drop in (True, False):
        m = _EosBoost(tiny_gpt, boost, at)
        g = generate(
            m, PROMPTS * 3, pad_id=0, eos_id=2, cfg=cfg, generator=torch.Generator().manual_seed(3), drop_finished=drop
        )
        runs[drop] = (g, m.rows)
    (a, rows), (b, full) = runs[True], runs[False]
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
    torch.testing.assert_close(a.logps, b.logps, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.raw_logps, b.raw_logps, atol=1e-5, rtol=1e-5)
    live = [int(x) for x in a.completion_mask.sum(0)]  # rows that sample step t (the forward before it runs them)
    assert full[1:] == [36] * (len(full) - 1)
    for k, n in enumerate(rows[1:], start=1):  # the k-th decode pass: the rows live at step k (4 at least) ...
        prev = rows[k - 1] if k > 1 else 36  # rows[0] is the prefill of the 9 prompts
        if n != prev or prev - live[k] >= max(1, prev / 8):  # ... once 1/8 of the rows held have finished
            assert n == max(live[k], 4)
    assert min(rows[1:]) < 36  # the test exercises the dropping


def test_groups_are_prompt_major_and_seeded(tiny_gpt):
    cfg = SamplingConfig(max_new_tokens=4, temperature=1.0, num_samples=3)
    a = generate(tiny_gpt, PROMPTS, pad_id=0, eos_id=2, cfg=cfg, generator=torch.Generator().manual_seed(5))
    b = generate(tiny_gpt, PROMPTS, pad_id=0, eos_id=2, cfg=cfg, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.sequences, b.sequences)
    assert a.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert (a.sequences[3:6, : a.prompt_length] == a.sequences[3, : a.prompt_length]).all()


@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=4), seed=st.integers(0, 1000))
def test_padding_does_not_change_greedy_output(lengths, seed):
    """Greedy completion of a prompt is the same alone or batched with prompts of other lengths."""
    from posttrain.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=13, n_layer=1, n_head=2, d_model=16, max_seq_len=24))
    g = torch.Generator().manual_seed(seed)
    prompts = [[1] + torch.randint(3, 13, (n,), generator=g).tolist() for n in lengths]
    cfg = SamplingConfig(max_new_tokens=4, temperature=0)
    batched = generate(m, prompts, pad_id=0, eos_id=2, cfg=cfg)
    for i, p in enumerate(prompts):
        alone = generate(m, [p], pad_id=0, eos_id=2, cfg=cfg)
        n = alone.completion_ids.shape[1]
        assert batched.completion_ids[i, :n].tolist() == alone.completion_ids[0].tolist()


@pytest.mark.parametrize("kw", [{"temperature": -1}, {"top_k": 0}, {"top_p": 0.0}, {"max_new_tokens": 0}])
def test_bad_sampling_config(kw):
    with pytest.raises(ConfigError):
        SamplingConfig(**kw)
