"""Hugging Face causal LMs wherever posttrain's GPT is accepted (needs the ``[hf]`` extra: transformers).

The sampler, losses and trainers only call ``model(input_ids, attention_mask, position_ids,
past_key_values, use_cache)`` and read ``.logits`` / ``.past_key_values``, which every
``AutoModelForCausalLM`` provides. This module builds such models:

- ``tiny_hf_config(kind, vocab_size, ...)``: a randomly initialised GPT-2 / Qwen2 / Llama config sized
  down to match a :class:`~posttrain.models.gpt.GPTConfig` (tests and benchmarks; no weights download);
- ``load_pretrained(path)``: a local model directory (``from_pretrained`` with ``local_files_only``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from posttrain.errors import UserError


def _transformers():
    try:
        import transformers
    except ImportError:
        raise UserError("Hugging Face models need transformers: pip install 'posttrain[hf]'") from None
    return transformers


def tiny_hf_config(
    kind: str = "gpt2",
    *,
    vocab_size: int,
    n_layer: int = 4,
    n_head: int = 4,
    d_model: int = 128,
    max_seq_len: int = 64,
    pad_id: int = 0,
    bos_id: int = 1,
    eos_id: int = 2,
):
    """A transformers config of the same size and shape as our GPT (for parity tests and benchmarks)."""
    tf = _transformers()
    common = dict(vocab_size=vocab_size, pad_token_id=pad_id, bos_token_id=bos_id, eos_token_id=eos_id)
    if kind == "gpt2":
        return tf.GPT2Config(
            n_layer=n_layer,
            n_head=n_head,
            n_embd=d_model,
            n_positions=max_seq_len,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            tie_word_embeddings=True,
            **common,
        )
    if kind == "qwen2":
        return tf.Qwen2Config(
            num_hidden_layers=n_layer,
            num_attention_heads=n_head,
            num_key_value_heads=n_head,
            hidden_size=d_model,
            intermediate_size=4 * d_model,
            max_position_embeddings=max_seq_len,
            tie_word_embeddings=True,
            **common,
        )
    if kind == "llama":
        return tf.LlamaConfig(
            num_hidden_layers=n_layer,
            num_attention_heads=n_head,
            num_key_value_heads=n_head,
            hidden_size=d_model,
            intermediate_size=4 * d_model,
            max_position_embeddings=max_seq_len,
            tie_word_embeddings=True,
            **common,
        )
    raise UserError(f"unknown tiny HF model kind {kind!r}; choose gpt2, qwen2 or llama")


def hf_model_from_config(config, attn_implementation: str = "sdpa") -> torch.nn.Module:
    tf = _transformers()
    return tf.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)


def hf_model_from_config_dict(d: dict) -> torch.nn.Module:
    tf = _transformers()
    config = tf.AutoConfig.for_model(**d)
    return hf_model_from_config(config)


def load_pretrained(path: str | Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A local Hugging Face model directory (never downloads)."""
    tf = _transformers()
    p = Path(path)
    if not (p / "config.json").is_file():
        raise UserError(f"{p} is not a Hugging Face model directory (no config.json)")
    return tf.AutoModelForCausalLM.from_pretrained(p, local_files_only=True, dtype=dtype)
