"""Scoring: run a causal LM over [prompt | completion] sequences and return the completion's log-probs.

Key insight: every trainer needs ``log pi(y_t | x, y_<t)`` of given completions; the model runs once
over the whole sequence and the logits at positions ``P-1 .. P+T-2`` predict completion tokens
``0 .. T-1``. The tensor maths (warp, gather, entropy, masking) is :mod:`posttrain.losses.logprobs`;
this module is the part that runs a model, as :mod:`posttrain.generate` is for sampling.

``shared_prefix_forward`` runs each distinct prompt once and shares its keys and values with the rows
that continue it (a prompt's G samples, a pair's chosen and rejected) through a :class:`ConcatKVCache` — the cache belongs to this engine, and the model only
sees its interface (``update(layer, k, v) -> (k, v)``, ``length``, ``get_seq_length()``), so
``models/`` never imports its callers.

Works with posttrain's GPT and with Hugging Face causal LMs (same call signature); the shared-prefix
path needs a model whose ``cache`` argument accepts any object with that interface (posttrain's GPT).
Not handled: packed sequences (one sequence per row).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.losses.logprobs import token_entropy, token_logps, warp_logits
from posttrain.models.digit_slots import model_positions
from posttrain.models.heads import positions_from_mask
from posttrain.ops.thread_invariant import gather_rows


class ConcatKVCache:
    """A growing cache built with ``torch.cat``, safe under autograd (the preallocated
    :class:`posttrain.models.gpt.KVCache` is written in place, which autograd cannot differentiate
    through). Used to train with a shared prompt prefix: run U distinct prompts once, ``reorder``
    (gather, differentiable) to their N samples, then the completions."""

    def __init__(self):
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.length = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer in self.k:
            k, v = torch.cat([self.k[layer], k], dim=2), torch.cat([self.v[layer], v], dim=2)  # (B, Hkv, Nk, D)
        self.k[layer], self.v[layer] = k, v
        return k, v

    def get_seq_length(self) -> int:
        return self.length

    def reorder(self, index: torch.Tensor) -> None:
        self.k = {i: gather_rows(t, index) for i, t in self.k.items()}
        self.v = {i: gather_rows(t, index) for i, t in self.v.items()}


def completion_logps(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_start: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    position_ids: torch.Tensor | None = None,
    completion_mask: torch.Tensor | None = None,
    return_entropy: bool = False,
):
    """Token log-probs of ``input_ids[:, completion_start:]`` under ``model`` (one forward pass).

    The sequences are [left-padded prompt | completion]; positions before ``completion_start`` are the
    prompt. Returns (B, T_completion) log-probs under the warped distribution (and entropies if asked).
    With ``completion_mask``, masked positions are 0 (a truncated-away pad token would otherwise be -inf).
    Works with posttrain's GPT and with Hugging Face causal LMs (same call signature).
    """
    if position_ids is None:
        position_ids = positions_from_mask(attention_mask)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    logits = out.logits[:, completion_start - 1 : -1]  # (B, Tc, V) predicts input_ids[:, completion_start:]
    lp, warped = completion_token_logps(
        logits, input_ids[:, completion_start:], temperature, top_k, top_p, completion_mask
    )
    return (lp, token_entropy(warped)) if return_entropy else lp


def completion_token_logps(logits, labels, temperature, top_k, top_p, completion_mask):
    """Warp, pick the labels' log-probs, zero masked positions. -> (logps (B, T), warped logits)."""
    warped = warp_logits(logits, temperature, top_k, top_p) if (temperature != 1.0 or top_k or top_p) else logits
    lp = token_logps(warped, labels)
    if completion_mask is not None:
        lp = torch.where(completion_mask.bool(), lp, torch.zeros_like(lp))
    return lp, warped


@dataclass
class SharedPrefixOutput:
    """:func:`shared_prefix_forward`'s output: the model at each row's last prompt position (gathered from its
    prompt's one run) and at its completion positions."""

    last_logits: torch.Tensor  # (N, V): at position P-1, predicts completion token 0
    last_hidden: torch.Tensor | None  # (N, D) final-norm hidden state there (with output_hidden_states)
    logits: torch.Tensor  # (N, T-P, V): at positions P .. T-1
    hidden: torch.Tensor | None  # (N, T-P, D) (with output_hidden_states)


def shared_prefix_forward(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_start: int,
    prompt_index: torch.Tensor,
    *,
    output_hidden_states: bool = False,
) -> SharedPrefixOutput:
    """One forward over [left-padded prompt | completion] rows with each distinct prompt run once.

    Rows sharing ``prompt_index`` share the prompt: the U distinct prompts go through the model once, their
    keys/values are gathered to the N rows (a differentiable index, so gradients reach the prompt positions
    exactly as in a full forward), then only the completion positions are run. Work drops from N*T to
    U*P + N*(T-P) token positions; causal attention makes it exact (a prompt position never sees a completion).
    Needs a model whose ``cache`` argument takes any object with the cache interface (``update``, ``length``;
    :class:`ConcatKVCache`): posttrain's GPT does. Users: the policy-gradient and PPO updates (G samples per
    prompt) and reward-model training (a pair's chosen and rejected rows).
    """
    P = completion_start
    uniq, inv = torch.unique(prompt_index, return_inverse=True)  # (U,), (N,)
    first = torch.zeros(len(uniq), dtype=torch.long, device=input_ids.device).scatter_(
        0, inv, torch.arange(len(inv), device=input_ids.device)
    )  # a representative row per prompt
    pos = model_positions(model, input_ids, positions_from_mask(attention_mask))  # (N, T)
    cache = ConcatKVCache()
    kw = {"output_hidden_states": True} if output_hidden_states else {}
    out = model(
        input_ids=input_ids[first, :P],
        attention_mask=attention_mask[first, :P],
        position_ids=pos[first, :P],
        cache=cache,
        use_cache=True,
        **kw,
    )
    last_logits = gather_rows(out.logits[:, -1], inv)  # (N, V)
    last_hidden = gather_rows(out.hidden_states[:, -1], inv) if output_hidden_states else None  # (N, D)
    if input_ids.shape[1] == P:  # no completion position to run
        n = len(inv)
        hidden = last_hidden.new_zeros((n, 0, last_hidden.shape[-1])) if output_hidden_states else None
        return SharedPrefixOutput(
            last_logits, last_hidden, last_logits.new_zeros((n, 0, last_logits.shape[-1])), hidden
        )
    cache.reorder(inv)
    out = model(
        input_ids=input_ids[:, P:],
        attention_mask=attention_mask,
        position_ids=pos[:, P:],
        cache=cache,
        use_cache=True,
        **kw,
    )
    return SharedPrefixOutput(last_logits, last_hidden, out.logits, out.hidden_states if output_hidden_states else None)


def prefix_shared_completion_logps(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_start: int,
    prompt_index: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    completion_mask: torch.Tensor | None = None,
    return_entropy: bool = True,
):
    """:func:`completion_logps` (with entropies unless ``return_entropy=False``) computed with each distinct prompt run once
    (:func:`shared_prefix_forward`: rows sharing ``prompt_index`` share the prompt's keys and values).

    The last completion position is not run: its logits would predict a token after the completion, and no other
    position attends to it (causal), so dropping it changes no output and saves 1/T of the completion work (the
    update's micro-batches are trimmed to their longest completion, T ~ 4-6 on the embedded task)."""
    P = completion_start
    out = shared_prefix_forward(model, input_ids[:, :-1], attention_mask[:, :-1], P, prompt_index)
    logits = torch.cat([out.last_logits[:, None], out.logits], dim=1)  # (N, T, V)
    lp, warped = completion_token_logps(logits, input_ids[:, P:], temperature, top_k, top_p, completion_mask)
    return (lp, token_entropy(warped)) if return_entropy else lp
