"""The thread count is a speed setting only: posttrain's model and its trainers give the same bits on 1 and 2 torch
threads (``ops/thread_invariant.py``).

Oracles: the plain op on one thread (each wrapped op on two threads equals the op it wraps on one: LayerNorm,
the row gather, PyTorch's fused attention, a linear layer on 1 to 2 * SMALL_ROWS rows), and the same computation on one thread (the model's forward and
backward, plain and shared-prefix, and short SFT and GRPO runs, whose weight files must be equal byte for byte).
The model-sized shapes matter: below torch's parallel grain every kernel runs on one thread anyway.
"""

from __future__ import annotations

import contextlib
import random

import pytest
import torch
import torch.nn as nn

from posttrain.models.gpt import GPT, GPTConfig
from posttrain.ops.dispatch import sdpa_attention
from posttrain.ops.thread_invariant import SMALL_ROWS, LayerNorm, Linear, gather_rows, on_one_thread
from posttrain.scoring import prefix_shared_completion_logps


@contextlib.contextmanager
def threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _grads(fn, n: int, *tensors):
    """(output, grads of ``tensors``) of ``fn()`` reduced against a fixed random cotangent, on ``n`` threads."""
    for t in tensors:
        t.grad = None
    with threads(n):
        out = fn()
        cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
        (out * cot).sum().backward()
    return out.detach().clone(), [t.grad.clone() for t in tensors]


def _assert_same(a, b):
    (out_a, grads_a), (out_b, grads_b) = a, b
    assert torch.equal(out_a, out_b)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        assert torch.equal(ga, gb)


def test_layer_norm_on_two_threads_is_nn_layer_norm_on_one():
    torch.manual_seed(0)
    ln = LayerNorm(128)
    nn.init.normal_(ln.weight), nn.init.normal_(ln.bias)
    ref = nn.LayerNorm(128)
    ref.load_state_dict(ln.state_dict())
    x = torch.randn(2688, 128, requires_grad=True)
    want = _grads(lambda: ref(x), 1, x, ref.weight, ref.bias)
    _assert_same(_grads(lambda: ln(x), 2, x, ln.weight, ln.bias), want)
    _assert_same(_grads(lambda: ln(x), 1, x, ln.weight, ln.bias), want)


def test_gather_rows_on_two_threads_is_indexing_on_one():
    torch.manual_seed(0)
    t = torch.randn(23, 4, 7, 32, requires_grad=True)
    index = torch.randperm(23).repeat_interleave(8)
    want = _grads(lambda: t[index], 1, t)
    _assert_same(_grads(lambda: gather_rows(t, index), 2, t), want)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_on_two_threads_is_nn_linear_on_one_for_every_row_count(bias):
    torch.manual_seed(0)
    lin = Linear(128, 384, bias=bias)
    ref = nn.Linear(128, 384, bias=bias)
    ref.load_state_dict(lin.state_dict())
    params = [lin.weight, lin.bias] if bias else [lin.weight]
    ref_params = [ref.weight, ref.bias] if bias else [ref.weight]
    for rows in range(1, 2 * SMALL_ROWS + 1):
        x = torch.randn(rows, 1, 128, requires_grad=True)
        want = _grads(lambda: ref(x), 1, x, *ref_params)  # noqa: B023
        _assert_same(_grads(lambda: lin(x), 2, x, *params), want)  # noqa: B023


@pytest.mark.parametrize("nq", [1, 3, 12])
def test_masked_attention_on_two_threads_is_sdpa_on_one(nq):
    torch.manual_seed(0)
    n, h, nk, d = 184, 4, 12, 32
    q = torch.randn(n, h, nq, d, requires_grad=True)
    k, v = torch.randn(n, h, nk, d, requires_grad=True), torch.randn(n, h, nk, d, requires_grad=True)
    mask = torch.ones(n, nk, dtype=torch.bool)
    mask[::3, :2] = False
    want = _grads(lambda: sdpa_attention(q, k, v, key_padding_mask=mask), 1, q, k, v)
    _assert_same(_grads(lambda: sdpa_attention(q, k, v, key_padding_mask=mask), 2, q, k, v), want)
    with torch.no_grad(), threads(2):  # a forward that records nothing takes the one-thread path too
        assert torch.equal(sdpa_attention(q, k, v, key_padding_mask=mask), want[0])


def test_on_one_thread_keeps_only_the_gradients_asked_for():
    a, b = torch.randn(300, 200, requires_grad=True), torch.randn(200, 300)
    with threads(2):
        out = on_one_thread(lambda a, b: a @ b, a, b)
        out.sum().backward()
    torch.testing.assert_close(a.grad, b.sum(1).expand(300, 200), rtol=1e-5, atol=1e-4)
    assert b.grad is None


def _batch(rng: random.Random, b: int, t: int):
    x = torch.randint(0, 32, (b, t), generator=torch.Generator().manual_seed(rng.randrange(2**31)))
    mask = torch.ones(b, t)
    for i in range(b):  # left padding, as the sampler's prompts
        mask[i, : rng.randint(0, 4)] = 0
    return x, mask


def _check_model(seed: int, draw):
    """Six draws of ``draw(model, rng) -> fn`` on a fresh default-shape GPT: ``fn``'s output and every parameter's
    gradient on two threads equal those on one."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32))
    params = list(model.parameters())
    rng = random.Random(seed)
    for _ in range(6):
        fn = draw(model, rng)
        _assert_same(_grads(fn, 2, *params), _grads(fn, 1, *params))


def test_model_forward_and_backward_do_not_depend_on_the_thread_count():
    def draw(model, rng):
        x, mask = _batch(rng, rng.randint(64, 256), rng.randint(6, 16))
        return lambda: model(x, attention_mask=mask).logits

    _check_model(0, draw)


def test_shared_prefix_logps_do_not_depend_on_the_thread_count():
    def draw(model, rng):
        u, g, p, tc = rng.randint(8, 32), 8, rng.randint(5, 9), rng.randint(2, 7)
        prompts, pmask = _batch(rng, u, p)
        x = torch.cat([prompts.repeat_interleave(g, 0), torch.randint(0, 32, (u * g, tc))], 1)
        mask = torch.cat([pmask.repeat_interleave(g, 0), torch.ones(u * g, tc)], 1)
        index = torch.arange(u).repeat_interleave(g)
        return lambda: prefix_shared_completion_logps(model, x, mask, p, index, return_entropy=False)

    _check_model(1, draw)


def test_sft_and_grpo_runs_end_byte_for_byte_on_one_and_two_threads(tmp_path):
    from posttrain.tasks.arithmetic import ArithmeticConfig
    from posttrain.trainers.policy_gradient import PolicyGradientConfig, train_policy_gradient
    from posttrain.trainers.sft import SFTConfig, train_sft

    task = ArithmeticConfig(num_demos=256, num_eval=16)
    weights = {}
    for n in (1, 2):
        sft, grpo = tmp_path / f"sft{n}", tmp_path / f"grpo{n}"
        common = dict(threads=n, progress=False, task=task, eval_every=0, save_every=0, warmup_steps=2)
        train_sft(SFTConfig(out=str(sft), steps=12, val_fraction=0, **common))
        train_policy_gradient(PolicyGradientConfig(out=str(grpo), init=str(sft), steps=3, lr=1e-3, **common))
        weights[n] = [(d / "model" / "model.safetensors").read_bytes() for d in (sft, grpo)]
    assert weights[1][0] == weights[2][0], "SFT"
    assert weights[1][1] == weights[2][1], "GRPO"
