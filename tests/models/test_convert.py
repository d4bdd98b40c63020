"""posttrain GPT <-> HF GPT2LMHeadModel: the converted model computes the same logits (HF is the oracle)."""

import pytest
import torch

pytest.importorskip("transformers")

from posttrain.errors import UserError  # noqa: E402
from posttrain.generate import SamplingConfig, generate  # noqa: E402
from posttrain.models.convert import gpt_to_hf_gpt2, hf_gpt2_to_gpt  # noqa: E402
from posttrain.models.gpt import GPT, GPTConfig  # noqa: E402
from posttrain.models.hf import hf_model_from_config, tiny_hf_config  # noqa: E402

V = 17


def _randomise(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Non-default values everywhere (LayerNorm weights 1 and biases 0 would hide a swapped ln/bias)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


@pytest.fixture(params=[(2, 2, 32, 4), (3, 4, 32, 2)], ids=["L2H2", "L3H4-mlp2"])
def gpt(request):
    n_layer, n_head, d_model, mlp_ratio = request.param
    return _randomise(
        GPT(
            GPTConfig(
                vocab_size=V, n_layer=n_layer, n_head=n_head, d_model=d_model, mlp_ratio=mlp_ratio, max_seq_len=24
            )
        ),
        seed=n_layer,
    )


def _left_padded(batch=4, T=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (batch, T), generator=g)
    mask = torch.ones(batch, T, dtype=torch.long)
    for b, n_pad in enumerate([0, 3, 5, 1][:batch]):
        ids[b, :n_pad] = 0
        mask[b, :n_pad] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


def test_logits_match_hf(gpt):
    hf = gpt_to_hf_gpt2(gpt).eval()
    x = torch.randint(0, V, (3, 20), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(hf(x).logits, gpt(x).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_logits_match_hf_left_padding(gpt, attn):
    hf = gpt_to_hf_gpt2(gpt, attn_implementation=attn).eval()
    ids, mask, pos = _left_padded()
    ours = gpt(ids, attention_mask=mask, position_ids=pos).logits
    theirs = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    real = mask.bool()  # pad query rows are garbage on both sides and never read
    torch.testing.assert_close(theirs[real], ours[real], atol=1e-5, rtol=1e-5)


def test_hf_to_gpt_matches(gpt):
    """The inverse direction from an independently initialised HF model (not one we converted)."""
    torch.manual_seed(0)
    hf = _randomise(
        hf_model_from_config(tiny_hf_config("gpt2", vocab_size=V, n_layer=2, n_head=2, d_model=32, max_seq_len=24)),
        seed=5,
    )
    ours = hf_gpt2_to_gpt(hf).eval()
    ids, mask, pos = _left_padded(seed=3)
    real = mask.bool()
    torch.testing.assert_close(
        ours(ids, attention_mask=mask, position_ids=pos).logits[real],
        hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits[real],
        atol=1e-5,
        rtol=1e-5,
    )
    assert ours.lm_head.weight is ours.wte.weight


def test_round_trip_is_exact(gpt):
    back = hf_gpt2_to_gpt(gpt_to_hf_gpt2(gpt))
    a, b = gpt.state_dict(), back.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert back.config == gpt.config


def test_converted_model_is_a_copy(gpt):
    hf = gpt_to_hf_gpt2(gpt)
    with torch.no_grad():
        hf.transformer.h[0].attn.c_attn.weight.add_(1.0)
    assert not torch.equal(hf.transformer.h[0].attn.c_attn.weight, gpt.blocks[0].attn.qkv.weight.t())


def test_same_samples_from_our_sampler():
    """Same weights + same generator -> the KV-cache sampler draws identical tokens from both models."""
    gpt = _randomise(GPT(GPTConfig(vocab_size=V, n_layer=2, n_head=2, d_model=32, max_seq_len=24)), seed=7)
    hf = gpt_to_hf_gpt2(gpt).eval()
    prompts = [[1, 5, 6, 14, 7, 8, 16], [1, 9, 16], [1, 5, 5, 5]]
    cfg = SamplingConfig(max_new_tokens=6, temperature=1.0, num_samples=2)
    a = generate(gpt, prompts, pad_id=0, eos_id=2, cfg=cfg, generator=torch.Generator().manual_seed(0))
    b = generate(hf, prompts, pad_id=0, eos_id=2, cfg=cfg, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a.sequences, b.sequences)
    torch.testing.assert_close(a.logps, b.logps, atol=1e-5, rtol=1e-5)


def test_unconvertible_models_raise():
    with pytest.raises(UserError, match="grouped-query"):
        gpt_to_hf_gpt2(GPT(GPTConfig(vocab_size=V, n_layer=1, n_head=4, n_kv_head=2, d_model=32)))
    with pytest.raises(UserError, match="biases"):
        gpt_to_hf_gpt2(GPT(GPTConfig(vocab_size=V, n_layer=1, n_head=2, d_model=32, bias=False)))
    hf = hf_model_from_config(tiny_hf_config("gpt2", vocab_size=V, n_layer=1, n_head=2, d_model=32))
    hf.config.activation_function = "relu"
    with pytest.raises(UserError, match="tanh GELU"):
        hf_gpt2_to_gpt(hf)
    qwen = hf_model_from_config(tiny_hf_config("qwen2", vocab_size=V, n_layer=1, n_head=2, d_model=32))
    with pytest.raises(UserError, match="GPT-2"):
        hf_gpt2_to_gpt(qwen)
