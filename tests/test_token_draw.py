"""The sampler's token draw: inverse CDF (one uniform per row) against a brute-force CDF walk, the exact
distribution, torch.multinomial (the old draw, kept as the oracle), and tokens of probability 0."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.generate import TOKEN_DRAWS, SamplingConfig, draw_inverse_cdf, draw_multinomial, generate, inverse_cdf

PROMPTS = [[1, 5, 6, 14, 7, 8, 16], [1, 9, 16], [1, 5, 5, 5]]


def _walk(p: list[float], u: float) -> int:
    """Brute force: the first token whose cumulative probability exceeds u * total."""
    total = 0.0
    for pj in p:
        total += pj
    acc = 0.0
    for j, pj in enumerate(p):
        acc += pj
        if acc > u * total:
            return j
    raise AssertionError("unreachable: the last token's cumulative sum is the total")


def test_inverse_cdf_matches_a_cdf_walk_with_the_same_uniforms():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(300, 50, generator=g) * 3
    logits[:, ::7] = float("-inf")  # masked tokens (top-k / top-p) in every row
    lp = torch.log_softmax(logits, -1)
    u = torch.rand(300, 1, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = inverse_cdf(lp, u)
    p = lp.double().exp().tolist()
    assert got.tolist() == [_walk(row, float(x)) for row, x in zip(p, u.squeeze(1).tolist())]
    # draw_inverse_cdf takes its uniforms from the generator, one per row
    again = draw_inverse_cdf(lp, torch.Generator().manual_seed(1))
    assert torch.equal(again, got)


def test_draw_has_the_softmax_distribution_as_multinomial_does():
    """200k draws of each: frequencies within 5 standard errors of p (and so of each other)."""
    probs = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.05, 0.0125, 0.0])
    lp = probs.log()[None].expand(200_000, -1)
    for name, fn in TOKEN_DRAWS.items():
        tok = fn(lp, torch.Generator().manual_seed(2))
        freq = torch.bincount(tok, minlength=len(probs)).double() / len(tok)
        se = (probs.double() * (1 - probs.double()) / len(tok)).sqrt()
        assert (freq - probs.double()).abs().le(5 * se + 1e-12).all(), (name, freq)
        assert freq[-1] == 0  # probability 0: never


@settings(max_examples=200, deadline=None)
@given(
    logits=st.lists(st.one_of(st.floats(-30, 30), st.just(float("-inf"))), min_size=1, max_size=12).filter(
        lambda xs: any(x != float("-inf") for x in xs)
    ),
    u=st.one_of(st.floats(0.0, 1.0, exclude_max=True), st.just(0.0), st.just(1.0 - 2.0**-53)),
)
def test_never_draws_a_token_of_probability_zero(logits, u):
    lp = torch.log_softmax(torch.tensor([logits]), -1)
    tok = int(inverse_cdf(lp, torch.tensor([[u]], dtype=torch.float64)))
    assert 0 <= tok < len(logits) and logits[tok] != float("-inf")
    assert tok == _walk(lp.double().exp()[0].tolist(), u)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, None, None), (0.7, 4, None), (1.0, None, 0.8)])
def test_generate_with_either_draw(tiny_gpt, temperature, top_k, top_p):
    """Both draws give valid samples whose log-probs are those of the warped distribution; same seed, same output."""
    cfg = SamplingConfig(max_new_tokens=6, temperature=temperature, top_k=top_k, top_p=top_p, num_samples=4)
    for draw in TOKEN_DRAWS:
        a = generate(
            tiny_gpt, PROMPTS, pad_id=0, eos_id=2, cfg=cfg, generator=torch.Generator().manual_seed(4), draw=draw
        )
        b = generate(
            tiny_gpt, PROMPTS, pad_id=0, eos_id=2, cfg=cfg, generator=torch.Generator().manual_seed(4), draw=draw
        )
        assert torch.equal(a.sequences, b.sequences) and torch.equal(a.logps, b.logps)
        assert (a.logps[a.completion_mask.bool()] <= 0).all()
        assert torch.isfinite(a.logps).all()  # a masked (-inf) token was never drawn
    with pytest.raises(ValueError, match="unknown token draw"):
        generate(tiny_gpt, PROMPTS, pad_id=0, eos_id=2, cfg=cfg, draw="gumbel")


def test_multinomial_draw_is_the_old_sampler():
    lp = torch.log_softmax(torch.randn(64, 20, generator=torch.Generator().manual_seed(5)), -1)
    old = torch.multinomial(lp.exp(), 1, generator=torch.Generator().manual_seed(6)).squeeze(-1)
    assert torch.equal(draw_multinomial(lp, torch.Generator().manual_seed(6)), old)
