"""Exact weight conversion between posttrain's GPT and Hugging Face ``GPT2LMHeadModel``.

Key insight: our GPT *is* GPT-2 (pre-norm blocks, learned positions, tanh-GELU MLP of width 4C,
LayerNorm eps 1e-5, tied LM head, attention scaled by 1/sqrt(head_dim)), so conversion is a renaming
plus one transpose: GPT-2 stores its projections as ``Conv1D`` with weight (in, out), where
``nn.Linear`` stores (out, in):

    transformer.h[i].attn.c_attn.weight  = blocks[i].attn.qkv.weight.T    # (C, 3C); q, k, v in that order
    transformer.h[i].attn.c_proj.weight  = blocks[i].attn.proj.weight.T   # (C, C)
    transformer.h[i].mlp.c_fc.weight     = blocks[i].mlp.fc.weight.T      # (C, 4C)
    transformer.h[i].mlp.c_proj.weight   = blocks[i].mlp.proj.weight.T    # (4C, C)
    transformer.{wte, wpe, ln_f}, h[i].ln_1 = ln1, h[i].ln_2 = ln2          (copied as they are)

Both directions copy tensors (the models never share storage). Used to start a TRL run and ours from
the *same* policy (``benchmarks/bench_grpo.py``) and to hand a posttrain checkpoint to HF tooling
(``posttrain export CKPT --format hf``, :mod:`posttrain.cli.export`).

Not handled (a clear error instead): grouped-query attention (``n_kv_head < n_head``), models without
biases, GPT-2 configs with untied heads, ``scale_attn_by_inverse_layer_idx`` or
``reorder_and_upcast_attn``, or an activation other than the tanh GELU.
"""

from __future__ import annotations

import torch

from posttrain.errors import UserError
from posttrain.models.gpt import GPT, GPTConfig

_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")

# per-block parameters: (ours, GPT-2's, transposed?)
_BLOCK_MAP = (
    ("ln1.weight", "ln_1.weight", False),
    ("ln1.bias", "ln_1.bias", False),
    ("attn.qkv.weight", "attn.c_attn.weight", True),
    ("attn.qkv.bias", "attn.c_attn.bias", False),
    ("attn.proj.weight", "attn.c_proj.weight", True),
    ("attn.proj.bias", "attn.c_proj.bias", False),
    ("ln2.weight", "ln_2.weight", False),
    ("ln2.bias", "ln_2.bias", False),
    ("mlp.fc.weight", "mlp.c_fc.weight", True),
    ("mlp.fc.bias", "mlp.c_fc.bias", False),
    ("mlp.proj.weight", "mlp.c_proj.weight", True),
    ("mlp.proj.bias", "mlp.c_proj.bias", False),
)
_TOP_MAP = (
    ("wte.weight", "transformer.wte.weight", False),
    ("wpe.weight", "transformer.wpe.weight", False),
    ("ln_f.weight", "transformer.ln_f.weight", False),
    ("ln_f.bias", "transformer.ln_f.bias", False),
)


def _name_pairs(n_layer: int):
    yield from _TOP_MAP
    for i in range(n_layer):
        for ours, theirs, t in _BLOCK_MAP:
            yield f"blocks.{i}.{ours}", f"transformer.h.{i}.{theirs}", t


def _transformers():
    try:
        import transformers
    except ImportError:
        raise UserError("converting to GPT-2 needs transformers: pip install 'posttrain[hf]'") from None
    return transformers


def _copy_state(src: dict, dst_model: torch.nn.Module, pairs) -> None:
    """dst[dst_name] <- src[src_name] (transposed where marked); every destination parameter is written."""
    dst = dict(dst_model.named_parameters())
    written = set()
    with torch.no_grad():
        for s, d, transpose in pairs:
            x = src[s].t() if transpose else src[s]
            if dst[d].shape != x.shape:
                raise UserError(f"shape mismatch converting {s} {tuple(x.shape)} -> {d} {tuple(dst[d].shape)}")
            dst[d].copy_(x)
            written.add(id(dst[d]))
    missing = [n for n, p in dst.items() if id(p) not in written]
    if missing:  # a tied head shares storage with wte and is covered by it
        raise UserError(f"conversion left parameters unset: {missing}")


def gpt_to_hf_gpt2(
    model: GPT,
    attn_implementation: str = "sdpa",
    pad_id: int | None = 0,
    bos_id: int | None = 1,
    eos_id: int | None = 2,
):
    """A ``transformers.GPT2LMHeadModel`` computing the same logits as ``model`` (weights copied); the special-token
    ids (default: the char tokenizer's) go into its config and generation config."""
    tf = _transformers()
    c = model.config
    if c.kv_heads != c.n_head:
        raise UserError(f"GPT-2 has no grouped-query attention (n_kv_head={c.n_kv_head}, n_head={c.n_head})")
    if not c.bias:
        raise UserError("GPT-2 always has biases; a model built with bias=False cannot be converted")
    if c.digit_slots:
        raise UserError(
            f"this model positions digits by place value (model.digit_slots={c.digit_slots}), which Hugging Face's "
            "GPT-2 does not compute: its outputs there would be wrong; use it with posttrain (models/digit_slots.py)"
        )
    hf_cfg = tf.GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.max_seq_len,
        n_embd=c.d_model,
        n_layer=c.n_layer,
        n_head=c.n_head,
        n_inner=c.mlp_ratio * c.d_model,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False,
        reorder_and_upcast_attn=False,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
    )
    hf = tf.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation=attn_implementation)
    ref = next(model.parameters())
    hf.to(device=ref.device, dtype=ref.dtype)
    _copy_state(dict(model.named_parameters()), hf, ((s, d, t) for s, d, t in _name_pairs(c.n_layer)))
    hf.train(model.training)
    return hf


def hf_gpt2_to_gpt(hf, attn_backend: str = "sdpa") -> GPT:
    """The inverse: a posttrain :class:`GPT` with ``hf``'s weights (a GPT-2 with the tanh GELU, tied head)."""
    c = hf.config
    if getattr(c, "model_type", None) != "gpt2":
        raise UserError(f"expected a GPT-2 model, got model_type={getattr(c, 'model_type', None)!r}")
    if c.activation_function not in _TANH_GELUS:
        raise UserError(f"GPT-2 activation {c.activation_function!r} is not the tanh GELU our GPT uses")
    if abs(c.layer_norm_epsilon - 1e-5) > 1e-12:
        raise UserError(f"GPT-2 layer_norm_epsilon={c.layer_norm_epsilon} differs from our LayerNorm's 1e-5")
    if c.scale_attn_by_inverse_layer_idx or c.reorder_and_upcast_attn or not c.scale_attn_weights:
        raise UserError(
            "GPT-2 attention variants (scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn, "
            "unscaled attention) have no equivalent in our GPT"
        )
    if not torch.equal(hf.lm_head.weight, hf.transformer.wte.weight):
        raise UserError("GPT-2 model has an untied LM head; our GPT ties it to the token embedding")
    n_inner = c.n_inner or 4 * c.n_embd
    if n_inner % c.n_embd:
        raise UserError(f"GPT-2 n_inner={n_inner} is not a multiple of n_embd={c.n_embd}")
    cfg = GPTConfig(
        vocab_size=c.vocab_size,
        n_layer=c.n_layer,
        n_head=c.n_head,
        d_model=c.n_embd,
        mlp_ratio=n_inner // c.n_embd,
        max_seq_len=c.n_positions,
        dropout=c.resid_pdrop,
        bias=True,
        attn_backend=attn_backend,
    )
    model = GPT(cfg)
    ref = next(hf.parameters())
    model.to(device=ref.device, dtype=ref.dtype)
    src = dict(hf.named_parameters())
    src.update({n: b for n, b in hf.named_buffers()})
    _copy_state(src, model, ((d, s, t) for s, d, t in _name_pairs(c.n_layer)))
    model.train(hf.training)
    return model


def gpt2_named_tensors(model: GPT):
    """``(GPT-2 name, tensor)`` for each of ``model``'s parameters, in GPT-2's layout (Conv1D weights transposed):
    what a GPT-2 loader (``GPT2LMHeadModel.load_state_dict``, vLLM's ``load_weights``) reads. Tensors are views of
    ``model``'s (no copy); the tied ``lm_head`` is ``transformer.wte``. Example: ``blocks.0.attn.qkv.weight`` (3C, C)
    -> ``("transformer.h.0.attn.c_attn.weight", (C, 3C))``."""
    params = dict(model.named_parameters())
    for ours, theirs, transpose in _name_pairs(model.config.n_layer):
        yield theirs, params[ours].t() if transpose else params[ours]
