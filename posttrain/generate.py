"""Batched sampling with a KV cache: G samples per prompt, left padding, EOS stop, sampling log-probs.

Key insight: with a KV cache each new token costs one forward pass over ONE position (keys and values
of the past are kept), instead of re-running the whole prefix; left padding lines every prompt up at
the right edge so all rows decode in lock-step.

For each step t, with warp = temperature -> top-k -> top-p (:func:`posttrain.losses.logprobs.warp_logits`):

    y_t ~ softmax(warp(logits_t))            logps[t]     = log softmax(warp(logits_t))[y_t]
                                             raw_logps[t] = log softmax(logits_t)[y_t]

``logps`` are the log-probs of the distribution actually sampled from, so an RL importance ratio built
on them is unbiased; recomputing them with a fresh forward pass over the finished sequences (same
warp) gives the same numbers (tested). Greedy decoding (``temperature=0``) has a point-mass sampling
distribution; its ``logps`` are the raw log-probs.

Works with posttrain's :class:`~posttrain.models.gpt.GPT` (preallocated cache) and with Hugging Face
causal LMs (their own cache), through the shared call signature.

Logits that are NaN or +Inf, or a row whose logits are all -Inf (a diverged model: nothing to sample from), are
refused before each draw with a one-line :class:`~posttrain.errors.NonFiniteError` naming the generated token
and, when the caller passes it, the training step.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from posttrain.config import check_fields, knob
from posttrain.errors import NonFiniteError
from posttrain.losses.logprobs import warp_logits
from posttrain.models.digit_slots import model_positions
from posttrain.models.heads import positions_from_mask


@dataclass
class SamplingConfig:
    max_new_tokens: int = knob(8, "tokens generated per sample at most (EOS stops earlier)", gt=0)
    temperature: float = knob(1.0, "softmax temperature; 0 = greedy", ge=0)
    top_k: int | None = knob(None, "keep the k most likely tokens (None = all)", ge=1)
    top_p: float | None = knob(None, "nucleus: keep the smallest set with this much probability (None = 1)", gt=0, le=1)
    num_samples: int = knob(1, "samples per prompt (the G of GRPO)", gt=0)

    def __post_init__(self):
        check_fields(self)  # bounds and finiteness, from the knobs above

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Generation:
    """Output of :func:`generate`; rows are prompt-major (the G samples of prompt i are rows iG..iG+G-1)."""

    sequences: torch.Tensor  # (N, P + T) [left-padded prompt | completion, pad after EOS]
    attention_mask: torch.Tensor  # (N, P + T) 1 on real prompt tokens and generated tokens up to EOS
    completion_ids: torch.Tensor  # (N, T)
    completion_mask: torch.Tensor  # (N, T) 1 for generated tokens, EOS included, 0 after it
    logps: torch.Tensor  # (N, T) log-probs under the sampling distribution (0 where masked)
    raw_logps: torch.Tensor  # (N, T) log-probs under the untempered, untruncated model (0 where masked)
    truncated: torch.Tensor  # (N,) bool: hit max_new_tokens without EOS
    prompt_index: torch.Tensor  # (N,) which prompt each row samples
    prompt_length: int  # P

    @property
    def position_ids(self) -> torch.Tensor:
        return positions_from_mask(self.attention_mask)

    def completion_lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(-1)


def left_pad(prompts: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """[[5, 6], [7]] -> ids [[5, 6], [pad, 7]], mask [[1, 1], [0, 1]]."""
    if not prompts:
        raise ValueError("no prompts to generate from")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt: every prompt needs at least one token (e.g. BOS)")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def _make_cache(model, batch: int, max_len: int):
    from posttrain.models.gpt import GPT

    return model.make_cache(batch, max_len) if isinstance(model, GPT) else None


def _is_gpt_cache(cache) -> bool:
    from posttrain.models.gpt import KVCache

    return isinstance(cache, KVCache)


def draw_inverse_cdf(logps: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``logps`` (N, V), drawn from softmax by inverse CDF: one uniform u per row,

        token = min{ j : F_j > u * F_V },   F_j = sum_{i <= j} p_i  (float64)

    Exact sampling with one random number per row. ``torch.multinomial`` (:func:`draw_multinomial`, its oracle)
    draws an exponential for every vocabulary entry instead: ~20x slower per call for V = 512 on CPU
    (benchmarks/bench_sampling.py). A token of probability 0 (a -inf log-prob) is never drawn."""
    # a CPU generator on a GPU run: u is drawn on the CPU (the stream a CPU run draws) and moved to the logits
    where = generator.device if generator is not None else logps.device
    u = torch.rand((logps.shape[0], 1), generator=generator, dtype=torch.float64, device=where).to(logps.device)
    return inverse_cdf(logps, u)


def inverse_cdf(logps: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token of each row whose CDF interval holds ``u`` (N, 1) in [0, 1): (N, V) log-probs -> (N,)."""
    cdf = logps.double().exp().cumsum(-1)  # (N, V)
    total = cdf[:, -1:]
    # u <= 1 - 2**-53 (a float64 uniform), so u * F_V rounds to below F_V: an index < V, of probability > 0
    return torch.searchsorted(cdf, u * total, right=True).squeeze(-1)


def draw_multinomial(logps: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """The same draw with ``torch.multinomial`` (the sampler's default until 2026-12-03; the oracle of the above)."""
    probs = logps.exp()
    if generator is not None and generator.device != probs.device:  # a CPU generator on a GPU run: the same stream
        return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(probs.device)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


TOKEN_DRAWS = {"inverse_cdf": draw_inverse_cdf, "multinomial": draw_multinomial}

# Fewer rows than this take another matmul kernel (a gemv) whose rounding differs from the batched one on CPU, so a
# row's logits would depend on how many rows are left: finished rows stay in the batch to keep it this large.
MIN_DECODE_ROWS = 4
# Dropping rows copies the cache of the rows kept (~1/7 of a decode step's cost per row for the tiny GPT): it waits
# until this fraction of the rows held have finished.
DROP_FRACTION = 1 / 8


def _drop_finished(cache, rows: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
    """Remove finished rows from the cache (``rows``: the batch rows it holds, in its order) once at least
    ``DROP_FRACTION`` of them have finished; returns the rows kept. Finished rows stay while fewer than
    ``MIN_DECODE_ROWS`` would remain."""
    keep = ~done[rows]  # (R,)
    if len(rows) - int(keep.sum()) < max(1, DROP_FRACTION * len(rows)):
        return rows
    short = min(MIN_DECODE_ROWS, len(rows)) - int(keep.sum())
    if short > 0:  # keep the first finished rows as filler
        filler = (~keep).nonzero().squeeze(1)[:short]
        keep[filler] = True
    if bool(keep.all()):
        return rows
    index = keep.nonzero().squeeze(1)
    cache.reorder(index)
    return rows[index]


def _repeat_cache(cache, index: torch.Tensor, G: int):
    """Expand a prefilled cache from B prompts to B*G rows (ours: index copy; HF: its own method)."""
    if _is_gpt_cache(cache):
        cache.reorder(index)
        return cache
    if hasattr(cache, "batch_repeat_interleave"):  # transformers DynamicCache
        cache.batch_repeat_interleave(G)
        return cache
    raise TypeError(f"cannot expand a cache of type {type(cache).__name__}; use num_samples=1")


def cache_kwarg(model) -> str:
    """``cache`` (posttrain, transformers >= 5.2x) or ``past_key_values`` (older transformers)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_of(out):
    c = getattr(out, "cache", None)
    return c if c is not None else getattr(out, "past_key_values", None)


@torch.no_grad()  # not inference_mode: RL feeds these tensors to autograd later
def generate(
    model,
    prompts: list[list[int]],
    *,
    pad_id: int,
    eos_id: int | None,
    cfg: SamplingConfig | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    drop_finished: bool = True,
    draw: str = "inverse_cdf",
    step: int | None = None,
) -> Generation:
    """Sample ``cfg.num_samples`` completions for each prompt (token-id lists, BOS included if wanted).

    ``generator`` makes sampling reproducible and independent of the global RNG. ``use_cache=False``
    recomputes the full prefix every step (the slow oracle the cache is tested against).
    ``drop_finished`` (posttrain's GPT cache only) stops running rows that have emitted EOS: the same tokens and
    log-probs (the sampler still draws for every row, so the RNG stream is unchanged), less work once most rows
    have ended; ``False`` runs every row to the last step (the oracle it is tested against).
    ``draw`` picks the token draw of :data:`TOKEN_DRAWS` (the same distribution, another random stream).
    ``step`` (a training step, optional) is named in the :class:`NonFiniteError` raised for NaN/Inf logits.
    """
    if draw not in TOKEN_DRAWS:
        raise ValueError(f"unknown token draw {draw!r}; available: {', '.join(TOKEN_DRAWS)}")
    cfg = cfg or SamplingConfig()
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, pad_id, device)  # (B, P)
    G = cfg.num_samples
    P = ids.shape[1]
    pos = model_positions(model, ids, positions_from_mask(mask))  # (B, P); digit slots for a model with them
    ckw = cache_kwarg(model)
    logits, cache, expand = _prefill(model, ids, mask, pos, G, cfg.max_new_tokens, use_cache, ckw)
    ids, mask, pos = ids[expand], mask[expand], pos[expand]  # (N, P)
    rows = torch.arange(ids.shape[0], device=device) if drop_finished and _is_gpt_cache(cache) else None
    draw_fn = TOKEN_DRAWS[draw]
    try:
        out_ids, out_mask, logps, raw_logps = _decode(
            model, logits, cache, ids, mask, pos, cfg, pad_id, eos_id, generator, use_cache, ckw, rows, draw_fn
        )
    except NonFiniteError as e:
        model.train(was_training)
        at = f" at step {step}" if step is not None else ""
        raise NonFiniteError(f"sampling{at}: {e} (the model diverged or its weights are corrupt)") from None
    ended = (
        (out_ids == eos_id) & out_mask.bool() if eos_id is not None else torch.zeros_like(out_mask, dtype=torch.bool)
    )
    model.train(was_training)
    return Generation(
        sequences=torch.cat([ids, out_ids], dim=1),
        attention_mask=torch.cat([mask, out_mask], dim=1),
        completion_ids=out_ids,
        completion_mask=out_mask,
        logps=logps,
        raw_logps=raw_logps,
        truncated=~ended.any(-1),
        prompt_index=torch.arange(len(prompts), device=device).repeat_interleave(G),
        prompt_length=P,
    )


def _prefill(model, ids, mask, pos, G: int, T: int, use_cache: bool, ckw: str):
    """Run each distinct prompt once, then copy its cache to its G samples: the G rows of a group share the
    prompt, so this saves (G-1)/G of the prefill work (Hugging Face expands before prefill).
    Returns (next-token logits (N, V), the expanded cache or None, the row -> prompt index (N,))."""
    B, P = ids.shape
    cache = _make_cache(model, B, P + T) if use_cache else None
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=use_cache, **{ckw: cache})
    logits = out.logits[:, -1].float()  # (B, V)
    expand = torch.arange(B, device=ids.device).repeat_interleave(G)  # (N,)
    if use_cache:
        cache = _cache_of(out)
        if G > 1:
            cache = _repeat_cache(cache, expand, G)
    return logits[expand], cache, expand


def _decode(
    model,
    logits,
    cache,
    ids,
    mask,
    pos,
    cfg: SamplingConfig,
    pad_id,
    eos_id,
    generator,
    use_cache: bool,
    ckw: str,
    rows: torch.Tensor | None = None,
    draw=draw_inverse_cdf,
):
    """Sample up to ``cfg.max_new_tokens`` tokens per row, in lock-step, stopping rows at EOS; without the
    cache, every step re-runs the whole prefix (the oracle). ``rows`` (the batch rows the cache holds) turns on
    dropping finished rows from the forward passes; their logits stay as they were (sampled, then discarded as
    padding). Returns (ids, mask, logps, raw_logps), (N, steps)."""
    N, T, device = ids.shape[0], cfg.max_new_tokens, ids.device
    next_pos = pos[:, -1] + 1  # (N,)
    out_ids = torch.full((N, T), pad_id, dtype=torch.long, device=device)
    out_mask = torch.zeros((N, T), dtype=torch.long, device=device)
    logps = torch.zeros((N, T), dtype=torch.float32, device=device)
    raw_logps = torch.zeros((N, T), dtype=torch.float32, device=device)
    done = torch.zeros(N, dtype=torch.bool, device=device)
    full_mask = mask
    steps = 0
    warped = cfg.temperature != 1.0 or cfg.top_k is not None or cfg.top_p is not None  # else sample from raw
    for t in range(T):
        check_logits(logits, t)
        raw = torch.log_softmax(logits, dim=-1)  # (N, V)
        if cfg.greedy:
            tok = logits.argmax(-1)  # (N,)
            lp_all = raw
        else:
            lp_all = (
                torch.log_softmax(warp_logits(logits, cfg.temperature, cfg.top_k, cfg.top_p), dim=-1) if warped else raw
            )
            tok = draw(lp_all, generator)  # (N,)
        live = ~done
        tok = torch.where(live, tok, torch.full_like(tok, pad_id))
        out_ids[:, t] = tok
        out_mask[:, t] = live.long()
        logps[:, t] = torch.where(live, lp_all.gather(-1, tok[:, None]).squeeze(-1), 0.0)
        raw_logps[:, t] = torch.where(live, raw.gather(-1, tok[:, None]).squeeze(-1), 0.0)
        if eos_id is not None:
            done = done | (live & (tok == eos_id))
        steps = t + 1
        if bool(done.all()) or t == T - 1:
            break
        full_mask = torch.cat([full_mask, live.long()[:, None]], dim=1)  # (N, P + t + 1)
        if use_cache:
            if rows is not None:
                rows = _drop_finished(cache, rows, done)
            run = slice(None) if rows is None else rows  # the rows this pass runs
            out = model(
                input_ids=tok[run, None],
                attention_mask=full_mask[run],
                position_ids=next_pos[run, None],
                use_cache=True,
                **{ckw: cache},
            )
            cache = _cache_of(out)
        else:
            seq = torch.cat([ids, out_ids[:, : t + 1]], dim=1)
            allpos = torch.cat([pos, next_pos[:, None] - t + torch.arange(t + 1, device=device)], dim=1)
            out = model(input_ids=seq, attention_mask=full_mask, position_ids=allpos)
        next_pos = next_pos + 1
        step_logits = out.logits[:, -1].float()
        logits = step_logits if rows is None else logits.index_copy(0, rows, step_logits)  # (N, V)
    return out_ids[:, :steps], out_mask[:, :steps], logps[:, :steps], raw_logps[:, :steps]


def check_logits(logits: torch.Tensor, t: int) -> None:
    """Raise :class:`NonFiniteError` unless every row of ``logits`` (N, V) has a finite maximum: a NaN or +Inf
    anywhere, or a row all -Inf, has no distribution to sample (the draw would return index V, out of range)."""
    top = logits.amax(-1)  # (N,) NaN propagates, +Inf stays +Inf, an all -Inf row gives -Inf
    if not bool(torch.isfinite(top).all()):
        row = int((~torch.isfinite(top)).nonzero()[0, 0])
        raise NonFiniteError(f"the next-token logits of row {row} are NaN/Inf at generated token {t + 1}")


def decode_completions(tokenizer, gen: Generation) -> list[str]:
    """Text of each completion, up to (not including) EOS."""
    texts = []
    for row, m in zip(gen.completion_ids.tolist(), gen.completion_mask.tolist()):
        toks = [t for t, keep in zip(row, m) if keep and t != tokenizer.eos_id]
        texts.append(tokenizer.decode(toks))
    return texts
