"""Triton kernels checked on the CPU through Triton's interpreter, in a subprocess.

TRITON_INTERPRET=1 only takes effect if it is set before ``triton`` is imported, so each check runs
this file as a script in a fresh interpreter and sends the kernel's outputs and the float64 oracle's back
as JSON; the comparison runs here.  The sizes are tiny because the interpreter runs every program with numpy.

Tolerance: elementwise ``|got - ref| <= atol + rtol * |ref|`` (torch.testing.assert_close) with an absolute
floor scaled to the problem, ``atol = c * eps(dtype) * S``, where S is the largest reference entry over all
four tensors (out, dq, dk, dv) of the case: all four are products of the same unit-normal inputs, so S is
the size at which the kernel's float32/bf16 rounding happens.  A relative error against each tensor's own
max|ref| cannot be used: with Nq = Nk = 1 the softmax is identically 1, so the exact dq, dk are 0 and the
kernel's rounding residue (~eps * |dO| * |V|, e.g. 2e-8 on an AMD EPYC) divided by 0 (clamped at 1e-12)
failed on some CPUs and not others.
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
    from posttrain.ops.naive import reference_attention

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
        "got": [a.double().tolist() for a in got],  # bf16 and float32 values are exact in float64
        "ref": [r.tolist() for r in ref],
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
    assert set(res["dtypes"]) == {f"torch.{CASES[name][-1]}"}
    got = [torch.tensor(t, dtype=torch.float64) for t in res["got"]]
    ref = [torch.tensor(t, dtype=torch.float64) for t in res["ref"]]
    scale = max(r.abs().max().item() for r in ref)  # S: the problem's magnitude (module docstring)
    # float32: c = 16 (1.9e-6 * S; the observed error is 0.5-2.2 eps * S on an Intel Xeon, 0.2 eps on the
    # AMD EPYC of the issue), tighter than the old 1e-5 * max|ref| wherever S is the tensor's own scale.
    # bf16: P is rounded to bf16 before the P^T dO and dS^T Q products (as in FlashAttention-2): c = 2.56,
    # i.e. 2e-2, the bound this test has always used, now with the absolute floor.
    c = 2.56 if CASES[name][-1] == "bfloat16" else 16
    eps = torch.finfo(getattr(torch, CASES[name][-1])).eps
    for what, a, r in zip(("out", "dq", "dk", "dv"), got, ref):
        torch.testing.assert_close(a, r, atol=c * eps * scale, rtol=c * eps, msg=lambda m: f"{name} {what}: {m}")


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
