"""A tiny decoder-only causal LM: pre-norm blocks, tied embeddings, learned positions, switchable attention.

Key insight: a GPT is token + position embeddings, then L blocks of
    x = x + Attn(LN(x));  x = x + MLP(LN(x))
and a final LN whose output is projected back onto the (tied) token embedding matrix.

The forward call has the Hugging Face causal-LM signature, so the sampler and trainers treat our model
and an ``AutoModelForCausalLM`` alike:

    out = model(input_ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
    out.logits          # (B, T, V)
    out.cache           # the cache, when use_cache (also as out.past_key_values, the older HF name)
    out.hidden_states   # (B, T, C) final-norm hidden states, when output_hidden_states (reward/value heads)

Padding: ``attention_mask`` (B, Nk) marks real tokens over all keys seen so far (cache + new); with left
padding pass ``position_ids`` (the sampler computes them from the mask). The KV cache is preallocated
(:class:`KVCache`), so a decode step writes one slot instead of concatenating. Any object with the same
interface works as ``cache`` (``update(layer, k, v) -> (k, v)`` over all keys so far, an int ``length``):
:class:`posttrain.scoring.ConcatKVCache` is one, owned by its caller (this module imports none of them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from posttrain.config import check_choice, check_fields, knob
from posttrain.errors import ConfigError
from posttrain.models.digit_slots import slot_positions
from posttrain.ops import ATTENTION_BACKENDS, attention
from posttrain.ops.thread_invariant import LayerNorm, Linear


@dataclass
class GPTConfig:
    vocab_size: int = knob(32, "vocabulary size (set from the tokenizer when it is built)", gt=0)
    n_layer: int = knob(4, "transformer blocks", gt=0)
    n_head: int = knob(4, "attention heads", gt=0)
    n_kv_head: int | None = knob(None, "key/value heads for grouped-query attention (None = n_head)", gt=0)
    d_model: int = knob(128, "residual stream width", gt=0)
    mlp_ratio: int = knob(4, "MLP hidden width = mlp_ratio * d_model", gt=0)
    max_seq_len: int = knob(64, "context length (learned position embeddings)", gt=0)
    dropout: float = knob(0.0, "dropout on attention output and MLP (0 keeps runs bitwise reproducible)", ge=0, lt=1)
    bias: bool = knob(True, "bias in linear layers and LayerNorm")
    attn_backend: str = knob("sdpa", "attention implementation: sdpa | naive | flash | triton")
    digit_slots: int = knob(
        0,
        "position each operand digit of an embedded-task problem by its place value, operands of up to this many "
        "digits right-aligned as if zero-padded (models/digit_slots.py; 0 = GPT-2's positions; such a model cannot "
        "be exported to Hugging Face GPT-2)",
        ge=0,
    )

    def __post_init__(self):
        check_fields(self, "model.")  # bounds and finiteness, from the knobs above
        if self.d_model % self.n_head:
            raise ConfigError(f"model.d_model={self.d_model} must be divisible by model.n_head={self.n_head}")
        kv = self.n_kv_head or self.n_head
        if self.n_head % kv:
            raise ConfigError(f"model.n_head={self.n_head} must be divisible by model.n_kv_head={kv}")

    def validate_backend(self) -> None:
        check_choice("model.attn_backend", self.attn_backend, tuple(ATTENTION_BACKENDS))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head


@dataclass
class LMOutput:
    logits: torch.Tensor
    past_key_values: "KVCache | None" = None
    hidden_states: torch.Tensor | None = None

    @property
    def cache(self) -> "KVCache | None":  # the name newer transformers use
        return self.past_key_values


class KVCache:
    """Preallocated keys/values for every layer: (L, B, Hkv, max_len, D) each, filled up to ``length``."""

    def __init__(self, cfg: GPTConfig, batch: int, max_len: int, device=None, dtype=torch.float32):
        shape = (cfg.n_layer, batch, cfg.kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0
        self.max_len = max_len

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, Hkv, T, D) at [length, length+T) and return all keys/values so far."""
        t0, t1 = self.length, self.length + k.shape[2]
        if t1 > self.max_len:
            raise ValueError(f"KV cache full: {t1} > max_len={self.max_len}")
        self.k[layer, :, :, t0:t1] = k
        self.v[layer, :, :, t0:t1] = v
        return self.k[layer, :, :, :t1], self.v[layer, :, :, :t1]

    def get_seq_length(self) -> int:  # the Hugging Face cache method name
        return self.length

    def reorder(self, index: torch.Tensor) -> None:
        """Rows ``index`` of the batch (repeat a prompt's row for its samples, or drop finished rows).

        When at least half the buffer is filled, whole rows are copied with ``index_select`` (~4x faster than
        gathering the filled part by advanced indexing, which is what a mostly empty buffer gets); positions
        past ``length`` are never read before they are written.
        """
        n = self.length
        for name in ("k", "v"):
            old = getattr(self, name)
            if 2 * n >= self.max_len:
                new = old.index_select(1, index)
            else:
                new = old.new_empty((old.shape[0], len(index), *old.shape[2:]))
                new[:, :, :, :n] = old[:, index, :, :n]
            setattr(self, name, new)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.n_head, self.kv_heads, self.hd = cfg.n_head, cfg.kv_heads, cfg.head_dim
        self.qkv = Linear(cfg.d_model, (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim, bias=cfg.bias)
        self.proj = Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, key_padding_mask, cache: KVCache | None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split([self.n_head * self.hd, self.kv_heads * self.hd, self.kv_heads * self.hd], dim=-1)
        q = q.view(B, T, self.n_head, self.hd).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, self.kv_heads, self.hd).transpose(1, 2)  # (B, Hkv, T, hd)
        v = v.view(B, T, self.kv_heads, self.hd).transpose(1, 2)  # (B, Hkv, T, hd)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (B, Hkv, Nk, hd)
        y = attention(q, k, v, causal=True, key_padding_mask=key_padding_mask, backend=self.cfg.attn_backend)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=cfg.bias)
        self.proj = Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, layer: int):
        super().__init__()
        self.ln1 = LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg, layer)
        self.ln2 = LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x, key_padding_mask, cache):
        x = x + self.attn(self.ln1(x), key_padding_mask, cache)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        cfg.validate_backend()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.ln_f = LayerNorm(cfg.d_model, bias=cfg.bias)
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied embeddings
        self.grad_checkpointing = False  # gradient_checkpointing_enable(): recompute each block in the backward
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2 scaled init of residual projections
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Per-block activation checkpointing in training forwards (Hugging Face's method name and arguments):
        each block's activations are recomputed in the backward pass instead of kept, trading one more block
        forward for memory. Non-reentrant (``use_reentrant=False``) unless the kwargs say otherwise; the RNG state
        is restored for the recomputation, so dropout masks and gradients are those of the plain forward."""
        self.grad_checkpointing = True
        self._ckpt_kwargs = {"use_reentrant": False, **(gradient_checkpointing_kwargs or {})}

    def gradient_checkpointing_disable(self) -> None:
        self.grad_checkpointing = False

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def make_cache(self, batch: int, max_len: int) -> KVCache:
        """A cache on the model's device, in the autocast dtype when autocast is on (bf16 keys and values for a bf16
        run's fp32 weights: half the memory), else the weights' dtype."""
        p = self.wte.weight
        on = torch.is_autocast_enabled(p.device.type)
        dtype = torch.get_autocast_dtype(p.device.type) if on else p.dtype
        return KVCache(self.config, batch, max_len, device=p.device, dtype=dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
        output_hidden_states: bool = False,
        cache: KVCache | None = None,
        **unused,
    ) -> LMOutput:
        past_key_values = past_key_values if past_key_values is not None else cache
        B, T = input_ids.shape
        past = past_key_values.length if past_key_values is not None else 0
        if use_cache and past_key_values is None:
            past_key_values = self.make_cache(B, min(self.config.max_seq_len, T + self.config.max_seq_len))
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=input_ids.device).expand(B, T)
        if self.config.digit_slots and past == 0:  # a whole row: its digits' slots (the cache path gets them from
            position_ids = slot_positions(input_ids, position_ids, self.config.digit_slots)  # its prefill's)
        if int(position_ids.max()) >= self.config.max_seq_len:
            raise ValueError(
                f"sequence position {int(position_ids.max())} exceeds max_seq_len={self.config.max_seq_len}"
            )
        # a mask with no padding needs no masking work: the backends take their fast causal path
        kpm = None if attention_mask is None or bool(attention_mask.all()) else attention_mask.bool()  # (B, Nk)
        x = self.drop(self.wte(input_ids) + self.wpe(position_ids))  # (B, T, C)
        cache = past_key_values if (use_cache or past_key_values is not None) else None
        recompute = self.grad_checkpointing and self.training and torch.is_grad_enabled() and cache is None
        for block in self.blocks:
            if recompute:
                x = torch.utils.checkpoint.checkpoint(block, x, kpm, None, **self._ckpt_kwargs)  # (B, T, C)
            else:
                x = block(x, kpm, cache)  # (B, T, C)
        if cache is not None:
            cache.length += T
        h = self.ln_f(x)  # (B, T, C)
        logits = self.lm_head(h)  # (B, T, V)
        return LMOutput(logits=logits, past_key_values=cache, hidden_states=h if output_hidden_states else None)
