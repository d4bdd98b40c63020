"""Peak memory of a call: the high-water mark of bytes allocated while it runs, above what was live before.

Key insight: peak = max_t sum_{events <= t} (+bytes on alloc, -bytes on free).  On CUDA the caching
allocator keeps that counter (``torch.cuda.max_memory_allocated``); on the CPU there is no such
counter, so we replay the allocator's events that ``torch.profiler`` records with
``profile_memory=True`` in time order and take the running maximum.

What this does NOT count: memory of tensors that existed before the call (the inputs), memory
the allocator holds but has not handed out, and allocations made outside PyTorch's allocator
(e.g. a BLAS library's private scratch buffers).  The profiler slows the call down, so time it
separately.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _cpu_peak_bytes(fn: Callable[[], Any]) -> tuple[int, Any]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        result = fn()
    events = [
        e
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    ]
    current = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        current += e.nbytes()  # positive: allocation, negative: free
        peak = max(peak, current)
    return peak, result


def _cuda_peak_bytes(fn: Callable[[], Any], device) -> tuple[int, Any]:
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before, result


def peak_memory(fn: Callable[[], Any], device: str | torch.device = "cpu") -> tuple[int, Any]:
    """Run ``fn()`` once; return (peak bytes allocated above the starting level, fn's result).

    Example: ``peak_memory(lambda: torch.empty(1024, dtype=torch.uint8))[0] == 1024``.
    Tensors the result keeps alive count, since they were allocated during the call.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_peak_bytes(fn, device)
    if device.type != "cpu":
        raise ValueError(f"peak_memory supports cpu and cuda devices, got {device}")
    return _cpu_peak_bytes(fn)


def attention_peak_memory(attn: Callable, q, k, v, backward: bool = False, **kwargs) -> int:
    """Peak bytes of ``attn(q, k, v, **kwargs)`` (and of its backward pass with dO = 1 if ``backward``).

    The inputs are allocated before the measurement and are not counted; the output and, with
    ``backward``, the gradients are.
    """
    q, k, v = (t.detach().requires_grad_(backward) for t in (q, k, v))
    grad_out = torch.ones_like(q) if backward else None

    def call():
        out = attn(q, k, v, **kwargs)
        if backward:
            return torch.autograd.grad(out, (q, k, v), grad_out)
        return out

    return peak_memory(call, q.device)[0]
