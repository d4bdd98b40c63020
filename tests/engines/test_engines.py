"""Rollout engines: our sampler matches the trainer's log-probs; a skewed engine's samples, reweighted by
truncated importance sampling, estimate expectations under the trainer's distribution; engine output assembles
into the trainer's layout; vLLM's weight names for a posttrain GPT are GPT-2's."""

import pytest
import torch

from posttrain.engines import NativeEngine, SkewedEngine
from posttrain.engines.batching import assemble
from posttrain.engines.vllm import VLLMEngine, vllm_named_tensors
from posttrain.errors import UserError
from posttrain.generate import SamplingConfig
from posttrain.losses.importance import truncated_is_weights
from posttrain.models.gpt import GPT, GPTConfig
from posttrain.scoring import completion_logps

PAD, EOS = 0, 2


def _model(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=12, n_layer=1, n_head=2, d_model=16, max_seq_len=16)).eval()


def _trainer_logps(model, gen, temperature):
    return completion_logps(
        model,
        gen.sequences,
        gen.attention_mask,
        gen.prompt_length,
        temperature=temperature,
        completion_mask=gen.completion_mask,
    )


def test_native_engine_logps_equal_the_trainers_so_weights_are_one():
    model = _model()
    eng = NativeEngine(model, PAD, EOS)
    gen = eng.generate([[1, 5, 6], [1, 7]], 4, SamplingConfig(max_new_tokens=5), torch.Generator().manual_seed(0))
    old = _trainer_logps(model, gen, 1.0)
    torch.testing.assert_close(gen.logps, old, atol=1e-5, rtol=0)
    w, m = truncated_is_weights(old, gen.logps, gen.completion_mask)
    torch.testing.assert_close(w, gen.completion_mask.float(), atol=1e-4, rtol=0)
    assert m["sampling_logp_difference"] < 1e-5


def test_skewed_engine_reweighted_estimates_the_trainers_distribution():
    """One-token completions: E_p[1{y=k}] = p_k is estimated from q-samples as mean(w * 1{y=k}), w = p/q.
    The bound is 4 standard errors of that mean (a two-sided z bound at ~6e-5 per token)."""
    model = _model(1)
    with torch.no_grad():
        model.ln_f.weight.mul_(12.0)  # a peaked next-token distribution, so that the skew matters
    skew, n = 1.6, 6000
    gen = SkewedEngine(model, PAD, EOS, skew=skew).generate(
        [[1, 4]], n, SamplingConfig(max_new_tokens=1), torch.Generator().manual_seed(3)
    )
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 4]])).logits[0, -1]
    p, q = torch.softmax(logits, -1), torch.softmax(logits / skew, -1)
    y = gen.completion_ids[:, 0]
    torch.testing.assert_close(gen.logps[:, 0], q.log()[y], atol=1e-5, rtol=0)  # it reports what it sampled from
    old = _trainer_logps(model, gen, 1.0)
    torch.testing.assert_close(old[:, 0], p.log()[y], atol=1e-5, rtol=0)
    w, _ = truncated_is_weights(old, gen.logps, gen.completion_mask, cap=1e6)
    ind = torch.nn.functional.one_hot(y, p.numel()).float() * w[:, :1]  # (n, V) w * 1{y = k}
    est, se = ind.mean(0), ind.std(0) / n**0.5
    assert bool(((est - p).abs() <= 4 * se + 1e-4).all()), (est, p)
    naive = torch.nn.functional.one_hot(y, p.numel()).float().mean(0)  # without the correction: q, not p
    assert (naive - p).abs().max() > 10 * se.max()


def test_assemble_rebuilds_our_samplers_layout_from_lists():
    model = _model(2)
    gen = NativeEngine(model, PAD, EOS).generate(
        [[1, 5, 6], [1]], 3, SamplingConfig(max_new_tokens=4), torch.Generator().manual_seed(5)
    )
    rows = [[t for t, k in zip(r, m) if k] for r, m in zip(gen.completion_ids.tolist(), gen.completion_mask.tolist())]
    lps = [[v for v, k in zip(r, m) if k] for r, m in zip(gen.logps.tolist(), gen.completion_mask.tolist())]
    T = gen.completion_ids.shape[1]
    out = assemble([[1, 5, 6], [1]], rows, lps, 3, pad_id=PAD, eos_id=EOS, max_new_tokens=T)
    for name in ("sequences", "attention_mask", "completion_ids", "completion_mask", "truncated", "prompt_index"):
        assert torch.equal(getattr(out, name), getattr(gen, name)), name
    torch.testing.assert_close(out.logps, gen.logps)
    with pytest.raises(ValueError, match="tokens after EOS"):
        assemble([[1]], [[EOS, 5]], [[0.0, 0.0]], 1, pad_id=PAD, eos_id=EOS, max_new_tokens=3)


def test_vllm_names_for_a_posttrain_gpt_are_gpt2s():
    pytest.importorskip("transformers")
    from posttrain.models.convert import gpt_to_hf_gpt2

    model = GPT(GPTConfig(vocab_size=12, n_layer=2, n_head=2, d_model=16, max_seq_len=16))
    hf_state = gpt_to_hf_gpt2(model).state_dict()
    pushed = dict(vllm_named_tensors(model))
    assert set(pushed) <= set(hf_state) and "transformer.h.1.attn.c_attn.weight" in pushed
    for name, t in pushed.items():
        assert torch.equal(t, hf_state[name]), name
    missing = set(hf_state) - set(pushed)  # only the tied head (= wte) and non-parameter buffers
    assert all(n == "lm_head.weight" or not n.endswith(("weight", "bias")) for n in missing), missing


def test_vllm_engine_without_vllm_is_a_clear_error():
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(UserError, match="needs vLLM on a CUDA machine"):
            VLLMEngine("/nonexistent", pad_id=0, eos_id=2)
    else:  # pragma: no cover
        pytest.skip("vLLM is installed: this machine can run the real engine")
