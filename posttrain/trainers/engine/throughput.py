"""What a training step costs: FLOPs per token, the GPUs' peak FLOP/s, peak memory (for tokens/s, MFU and memory in
each step's metrics: :class:`posttrain.trainers.engine.device.RunDevice`).

MFU (model FLOPs utilisation; PaLM, Chowdhery et al. 2022, appendix B; nanoGPT's ``estimate_mfu``)::

    flops_per_token = 6 N + 12 L H Q T        MFU = flops_per_token x tokens/s / peak FLOP/s

``N``: the parameters that multiply (every weight but the lookup-only embeddings: position embeddings and an input
embedding not tied to the output projection), ``L`` layers, ``H`` query heads of width ``Q``, ``T`` the sequence
length: 6N is a matmul's forward (2N) and backward (4N); 12LHQT the attention scores and the weighted sum of values,
counted over the full T x T square (the causal half is not subtracted, as PaLM and nanoGPT count). Worked number,
GPT-2 small (L=12, H=12, Q=64, d=768, V=50257, T=1024, tied embeddings): N = 124,439,808 - 786,432 (positions) =
123,653,376; 6N = 741,920,256; 12LHQT = 113,246,208; 855,166,464 FLOPs per token, so 40 % MFU of an H100 SXM's
989 TFLOP/s dense bf16 is 463k tokens/s. The peaks are :func:`peak_flops`'s table (datasheet dense tensor-core
figures; fp32 is the non-tensor-core figure); an unlisted GPU and the CPU give MFU None.

Peak memory (:func:`peak_memory`) is ``torch.cuda.max_memory_allocated`` on CUDA; on the CPU the process's maximum
resident set size (``ru_maxrss``: the whole process since it started).
"""

from __future__ import annotations

import resource
import sys

import torch
import torch.nn as nn


def flop_shape(model: nn.Module) -> tuple[int, int, int]:
    """(layers, query heads, head width) of the transformer inside ``model`` (posttrain's GPT, a Hugging Face model,
    or either wrapped in a reward/value head)."""
    for m in model.modules():
        c = getattr(m, "config", None)
        if c is None:
            continue
        if hasattr(c, "n_layer") and hasattr(c, "n_head"):  # GPTConfig, GPT2Config
            d = getattr(c, "d_model", None) or getattr(c, "n_embd")
            return int(c.n_layer), int(c.n_head), int(d // c.n_head)
        if hasattr(c, "num_hidden_layers") and hasattr(c, "num_attention_heads"):  # Llama, Qwen2, ...
            q = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
            return int(c.num_hidden_layers), int(c.num_attention_heads), int(q)
    raise TypeError(f"{type(model).__name__}: no transformer config to count FLOPs from")


def matmul_params(model: nn.Module) -> int:
    """N of the FLOP count: every parameter once, less the embedding tables used only as lookups (position
    embeddings; an input embedding whose weight is not also an output projection's)."""
    params = {id(p): p.numel() for p in model.parameters()}
    projected = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    lookups = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)} - projected
    return sum(n for k, n in params.items() if k not in lookups)


def flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> int:
    """Training FLOPs per token, ``6 N + 12 L H Q T`` (module docstring). Example: N=1000, L=2, H=2, Q=8, T=16 ->
    6000 + 12*2*2*8*16 = 12144."""
    return 6 * n_params + 12 * n_layer * n_head * head_dim * seq_len


# Dense (no structured sparsity) datasheet peaks in FLOP/s: (bf16/fp16 tensor cores, fp32 without tensor cores).
# The first name that occurs in torch.cuda.get_device_name() wins, so longer names come first.
PEAK_FLOPS = (
    ("GH200", 989e12, 67e12),
    ("H200", 989e12, 67e12),
    ("H100 PCIe", 756e12, 51e12),
    ("H100 NVL", 835e12, 60e12),
    ("H100", 989e12, 67e12),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H800", 989e12, 67e12),
    ("B200", 2250e12, 80e12),
    ("A100", 312e12, 19.5e12),
    ("A800", 312e12, 19.5e12),
    ("L40S", 362e12, 91.6e12),
    ("L40", 181e12, 90.5e12),
    ("L4", 121e12, 30.3e12),
    ("A10G", 70e12, 31.2e12),
    ("A10", 125e12, 31.2e12),
    ("RTX 4090", 165e12, 82.6e12),
    ("RTX 3090", 71e12, 35.6e12),
    ("A6000", 155e12, 38.7e12),
    ("V100", 125e12, 15.7e12),  # fp16 only: no bf16 tensor cores
    ("T4", 65e12, 8.1e12),  # fp16 only
)


def peak_flops(device: torch.device | str, dtype: str = "bf16") -> float | None:
    """The device's peak FLOP/s for ``dtype`` (fp32 | bf16 | fp16) from :data:`PEAK_FLOPS`; None on the CPU and
    for a GPU the table does not list. Example: "NVIDIA H100 80GB HBM3", bf16 -> 989e12."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return peak_flops_of(torch.cuda.get_device_name(device), dtype)


def peak_flops_of(name: str, dtype: str = "bf16") -> float | None:
    """:func:`peak_flops` by the GPU's name (testable without one)."""
    for key, half, fp32 in PEAK_FLOPS:
        if key in name:
            return fp32 if dtype == "fp32" else half
    return None


def peak_memory(device: torch.device | str) -> tuple[float | None, str]:
    """(peak bytes, what was measured): ``cuda_max_allocated`` (tensors torch allocated on the device since the run
    started) or ``cpu_max_rss`` (the process's maximum resident set size since it started, all memory included)."""
    device = torch.device(device)
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return float(rss if sys.platform == "darwin" else rss * 1024), "cpu_max_rss"
