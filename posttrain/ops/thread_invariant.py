"""Ops whose gradients do not depend on the number of CPU threads.

Key insight: on the CPU most ops of the model give the same bits on 1 thread or on n (matmuls of many rows split
rows and columns, never the summed dimension; elementwise ops, per-row softmax and LayerNorm's forward are per
row). Four kernels are not. Two backward kernels split a sum over rows into one partial sum per thread,

    LayerNorm:        dgamma = sum_rows(dy * x_hat),   dbeta = sum_rows(dy)
    row gather t[i]:  dt[u]  = sum_{n : i[n] = u} dy[n]        (index_put_ with accumulate)

PyTorch's fused CPU attention (``scaled_dot_product_attention``) picks its key/value blocking from the thread
count, forward and backward, and a matrix product of a few rows (5-11 on the AVX-512 EPYC measured; a sampler's
decode step once most rows have ended) takes another kernel on several threads. Running just those on one thread
(products of fewer than :data:`SMALL_ROWS` rows, which cost little anyway; the rest of the step keeps every thread)
makes a run with ``--threads 2`` end bit for bit where ``--threads 1`` does: the thread count is a speed setting
only, and results recorded on one thread still hold. Off the CPU, on one thread, or under torch.compile they are
the plain ops.
"""

from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn as nn
import torch.nn.functional as F

_outer = threading.local()  # inside one_thread(): the count outside it


@contextlib.contextmanager
def one_thread():
    threads = torch.get_num_threads()
    nested = getattr(_outer, "threads", None) is not None
    if not nested:
        _outer.threads = threads
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if not nested:
            _outer.threads = None


def thread_count() -> int:
    """torch's CPU threads as the run set them: inside :func:`one_thread` the count outside it, so an op recomputed
    there (a checkpointed block's forward, run again by a backward on one thread) takes the path it took first."""
    return getattr(_outer, "threads", None) or torch.get_num_threads()


def several_threads(x: torch.Tensor) -> bool:
    """A CPU op on several threads, outside torch.compile: where the kernels above would depend on their count."""
    return x.device.type == "cpu" and thread_count() > 1 and not torch.compiler.is_compiling()


def needs_one_thread(x: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """A CPU fp32 forward that records gradients on several threads (where the two backward kernels differ)."""
    return (
        several_threads(x)
        and torch.is_grad_enabled()
        and (x.requires_grad or any(p is not None and p.requires_grad for p in params))
        and x.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
    )


class _LayerNorm(torch.autograd.Function):
    """``native_layer_norm``; its backward (the same kernel autograd calls) on one thread."""

    @staticmethod
    def forward(ctx, x, weight, bias, normalized_shape, eps):
        out, mean, rstd = torch.ops.aten.native_layer_norm(x, normalized_shape, weight, bias, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.normalized_shape = normalized_shape
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        mask = [bool(n) for n in ctx.needs_input_grad[:3]]
        with one_thread():
            dx, dw, db = torch.ops.aten.native_layer_norm_backward(
                grad_out.contiguous(), x, ctx.normalized_shape, mean, rstd, weight, bias, mask
            )
        return dx, dw, db, None, None


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (same parameters, state-dict names and values) with thread-count-invariant gradients."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is not None and needs_one_thread(x, self.weight, self.bias):
            return _LayerNorm.apply(x, self.weight, self.bias, list(self.normalized_shape), self.eps)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class _GatherRows(torch.autograd.Function):
    """``t[index]``; its backward (autograd's: zeros, then ``index_put_`` with accumulate) on one thread."""

    @staticmethod
    def forward(ctx, t, index):
        ctx.save_for_backward(index)
        ctx.shape = t.shape
        return t[index]

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        with one_thread():
            dt = grad.new_zeros(ctx.shape).index_put_((index,), grad, accumulate=True)
        return dt, None


def gather_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[index]`` (rows of ``t`` picked, repeated, reordered by a 1-D long ``index``) with a thread-count-invariant
    gradient."""
    if needs_one_thread(t):
        return _GatherRows.apply(t, index)
    return t[index]


class _OneThread(torch.autograd.Function):
    """``fn(*tensors)`` with its forward and its backward (autograd's own, on a graph kept here) on one thread."""

    @staticmethod
    def forward(ctx, fn, *tensors):
        with torch.enable_grad(), one_thread():
            ctx.inputs = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
            ctx.out = fn(*ctx.inputs)
        return ctx.out.detach()

    @staticmethod
    def backward(ctx, grad):
        needed = [t.requires_grad for t in ctx.inputs]
        with one_thread():
            grads = iter(torch.autograd.grad(ctx.out, [t for t in ctx.inputs if t.requires_grad], grad))
        del ctx.inputs, ctx.out  # the kept graph
        return (None, *(next(grads) if n else None for n in needed))


def on_one_thread(fn, *tensors: torch.Tensor) -> torch.Tensor:
    """``fn(*tensors)`` (one tensor out), forward and backward on one thread when several would change its bits."""
    if not several_threads(tensors[0]):
        return fn(*tensors)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        with one_thread():
            return fn(*tensors)
    return _OneThread.apply(fn, *tensors)


SMALL_ROWS = 64  # a linear layer on fewer rows runs on one thread (products of 5-11 rows differ on two)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, state-dict names and values) whose products of few rows run on one thread."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() < SMALL_ROWS * x.shape[-1] and several_threads(x):
            return on_one_thread(F.linear, x, *(p for p in (self.weight, self.bias) if p is not None))
        return F.linear(x, self.weight, self.bias)
