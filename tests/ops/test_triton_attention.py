"""Triton kernels checked on the CPU through Triton's interpreter, in a subprocess.

TRITON_INTERPRET=1 only takes effect if it is set before ``triton`` is imported, so each check runs
this file as a script in a fresh interpreter and reports the max errors as JSON.  The sizes are
tiny because the interpreter runs every program with numpy.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

CASES = {  # name: (B, H, Hkv, Nq, Nk, D, causal, padded, dtype)
    "causal_square_gqa": (1, 4, 2, 21, 21, 8, True, False, "float32"),
    "full_padded_odd_d": (2, 2, 2, 17, 40, 24, False, True, "float32"),
    "decode_nq1": (2, 2, 1, 1, 37, 16, True, True, "float32"),
    "nq_gt_nk_empty_rows": (2, 2, 1, 33, 17, 8, True, True, "float32"),
    "n1": (1, 1, 1, 1, 1, 4, True, False, "float32"),
    "bfloat16": (1, 2, 2, 24, 24, 16, True, False, "bfloat16"),
}


def _run_case(name: str) -> dict:
    """Executed inside the subprocess (TRITON_INTERPRET=1): triton vs autograd through the naive oracle."""
    from posttrain.ops import attention
    from posttrain.ops.attention import reference_attention

    b, h, hkv, nq, nk, d, causal, padded, dtype = CASES[name]
    dtype = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, nq, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, nk, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, nk, d, generator=g).to(dtype)
    go = torch.randn(b, h, nq, d, generator=g).to(dtype)
    kpm = None
    if padded:
        kpm = torch.rand(b, nk, generator=g) > 0.3
        kpm[-1] = False  # one sequence with no real key: zeros and zero grads
    results = []
    for fn, cast in (
        (lambda q, k, v: attention(q, k, v, causal, kpm, 0.3, backend="triton"), lambda t: t),
        (lambda q, k, v: reference_attention(q, k, v, causal, kpm, 0.3), lambda t: t.double()),
    ):
        qq, kk, vv = (cast(t).clone().requires_grad_() for t in (q, k, v))
        out = fn(qq, kk, vv)
        results.append((out, *torch.autograd.grad(out, (qq, kk, vv), cast(go))))
    got, ref = results
    return {
        # error relative to the largest reference entry of each tensor (out, dq, dk, dv)
        "err": [((a.double() - r).abs().max() / r.abs().max().clamp_min(1e-12)).item() for a, r in zip(got, ref)],
        "finite": all(bool(torch.isfinite(t).all()) for t in got),
        "dtypes": [str(t.dtype) for t in got],
        "empty_zero": (not padded) or all(bool((t[-1] == 0).all()) for t in got),
    }


def _in_subprocess(name: str) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(CASES))
def test_triton_kernels_in_interpreter(name):
    res = _in_subprocess(name)
    assert res["finite"] and res["empty_zero"], res
    # bf16: P is rounded to bf16 before the P^T dO and dS^T Q products (as in FlashAttention-2)
    tol = 2e-2 if CASES[name][-1] == "bfloat16" else 1e-5
    assert max(res["err"]) < tol, res
    assert set(res["dtypes"]) == {f"torch.{CASES[name][-1]}"}


def test_triton_backend_refuses_cpu_without_interpreter():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("this process runs under the interpreter, where CPU tensors are allowed")
    pytest.importorskip("triton")
    from posttrain.ops import attention

    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(RuntimeError, match="CUDA tensors"):
        attention(q, q, q, backend="triton")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_matches_sdpa_on_gpu(causal, dtype):
    from posttrain.ops import attention

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, go = (torch.randn(2, 4, 300, 64, device="cuda", generator=g, dtype=dtype) for _ in range(4))
    res = []
    for backend in ("triton", "sdpa"):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        out = attention(qq, kk, vv, causal, backend=backend)
        res.append((out, *torch.autograd.grad(out, (qq, kk, vv), go)))
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    for a, b in zip(*res):
        torch.testing.assert_close(a, b, **tol)


if __name__ == "__main__":
    print(json.dumps(_run_case(sys.argv[1])))
