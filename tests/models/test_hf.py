"""A Hugging Face causal LM works wherever our GPT does (sampler, log-probs, SFT loss, checkpoints)."""

import pytest
import torch

pytest.importorskip("transformers")

from posttrain.generate import SamplingConfig, generate  # noqa: E402
from posttrain.models import load_model, save_model  # noqa: E402
from posttrain.models.hf import hf_model_from_config, tiny_hf_config  # noqa: E402
from posttrain.scoring import completion_logps  # noqa: E402
from posttrain.trainers.sft import sft_loss  # noqa: E402


@pytest.fixture(params=["gpt2", "qwen2"])
def hf_model(request):
    torch.manual_seed(0)
    return hf_model_from_config(tiny_hf_config(request.param, vocab_size=17, n_layer=2, n_head=2, d_model=32))


PROMPTS = [[1, 5, 6, 14, 7, 8, 16], [1, 9, 16], [1, 5, 5, 5]]


def test_hf_greedy_cache_equals_recompute(hf_model):
    cfg = SamplingConfig(max_new_tokens=6, temperature=0)
    a = generate(hf_model, PROMPTS, pad_id=0, eos_id=2, cfg=cfg)
    b = generate(hf_model, PROMPTS, pad_id=0, eos_id=2, cfg=cfg, use_cache=False)
    assert torch.equal(a.sequences, b.sequences)


def test_hf_sampling_logps_recompute(hf_model):
    cfg = SamplingConfig(max_new_tokens=6, temperature=0.8, top_k=8, top_p=0.9, num_samples=3)
    g = generate(hf_model, PROMPTS, pad_id=0, eos_id=2, cfg=cfg, generator=torch.Generator().manual_seed(0))
    lp = completion_logps(
        hf_model,
        g.sequences,
        g.attention_mask,
        g.prompt_length,
        temperature=0.8,
        top_k=8,
        top_p=0.9,
        completion_mask=g.completion_mask,
    )
    torch.testing.assert_close(lp, g.logps, atol=1e-5, rtol=1e-5)


def test_hf_sft_loss_and_checkpoint(tmp_path, hf_model):
    ids = torch.randint(3, 17, (4, 8))
    mask = torch.zeros_like(ids)
    mask[:, 4:] = 1
    loss = sft_loss(hf_model, ids, mask, int(mask[:, 1:].sum()))
    loss.backward()
    assert torch.isfinite(loss)
    save_model(hf_model, tmp_path)
    m = load_model(tmp_path)
    assert torch.equal(m(ids).logits, hf_model(ids).logits)
