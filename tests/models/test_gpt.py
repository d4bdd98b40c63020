import pytest
import torch

from posttrain.errors import ConfigError
from posttrain.models import load_model, save_model
from posttrain.models.gpt import GPT, GPTConfig


def test_shapes_and_tied_embeddings(tiny_gpt):
    x = torch.randint(0, 17, (3, 7))
    out = tiny_gpt(x)
    assert out.logits.shape == (3, 7, 17)
    assert tiny_gpt.lm_head.weight is tiny_gpt.wte.weight


def test_causality(tiny_gpt):
    """Changing a later token never changes earlier logits."""
    x = torch.randint(0, 17, (1, 9))
    y = x.clone()
    y[0, 6] = (y[0, 6] + 1) % 17
    a, b = tiny_gpt(x).logits, tiny_gpt(y).logits
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_kv_cache_matches_full_forward(tiny_gpt):
    x = torch.randint(0, 17, (2, 10))
    full = tiny_gpt(x).logits
    cache = tiny_gpt.make_cache(2, 10)
    parts = [tiny_gpt(x[:, :4], past_key_values=cache, use_cache=True).logits]
    for t in range(4, 10):
        parts.append(tiny_gpt(x[:, t : t + 1], past_key_values=cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)


def test_left_padding_is_invisible(tiny_gpt):
    """A left-padded row with position ids from the mask gives the same logits as the unpadded row."""
    x = torch.randint(3, 17, (1, 5))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x], 1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    a = tiny_gpt(x).logits
    b = tiny_gpt(padded, attention_mask=mask, position_ids=pos).logits[:, 3:]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_save_load_roundtrip(tmp_path, tiny_gpt):
    save_model(tiny_gpt, tmp_path)
    m = load_model(tmp_path)
    x = torch.randint(0, 17, (2, 6))
    assert torch.equal(m(x).logits, tiny_gpt(x).logits)
    assert m.lm_head.weight is m.wte.weight


@pytest.mark.parametrize(
    "kw", [{"d_model": 30, "n_head": 4}, {"n_layer": 0}, {"n_head": 4, "n_kv_head": 3}, {"dropout": 1.0}]
)
def test_bad_config(kw):
    with pytest.raises(ConfigError):
        GPTConfig(**kw)


def test_unknown_backend():
    with pytest.raises(ConfigError, match="attn_backend"):
        GPT(GPTConfig(attn_backend="nope"))


def test_grouped_query_attention_runs():
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=11, n_layer=1, n_head=4, n_kv_head=2, d_model=32))
    assert m(torch.randint(0, 11, (2, 5))).logits.shape == (2, 5, 11)
