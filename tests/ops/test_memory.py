"""The peak-memory helper against allocations of known size, and flash vs naive attention memory."""

import torch

from posttrain.ops.flash import flash_attention
from posttrain.ops.memory import attention_peak_memory, peak_memory
from posttrain.ops.naive import naive_attention


def test_known_allocations():
    peak, out = peak_memory(lambda: torch.empty(1 << 20, dtype=torch.uint8))
    assert peak == 1 << 20 and out.numel() == 1 << 20

    def temp_then_small():
        big = torch.ones(1 << 18, dtype=torch.float32)  # 1 MiB, freed before returning
        small = big[:16].clone()  # 64 bytes kept
        del big
        return small

    peak, _ = peak_memory(temp_then_small)
    assert 1 << 20 <= peak <= (1 << 20) + 4096


def test_flash_uses_far_less_memory_than_naive():
    q = torch.randn(1, 2, 1024, 16)
    naive = attention_peak_memory(naive_attention, q, q, q, causal=False)
    flash = attention_peak_memory(flash_attention, q, q, q, causal=False, block_q=128, block_k=128)
    scores = 2 * 1024 * 1024 * 4  # one (H, N, N) float32 matrix
    assert naive >= 2 * scores  # S and P are both materialised
    assert flash < scores / 4  # O(N) + one tile
    back = attention_peak_memory(flash_attention, q, q, q, backward=True, causal=True, block_q=128, block_k=128)
    assert back >= 3 * q.numel() * 4  # at least dQ, dK, dV
    assert back < scores / 2
