"""Policy-gradient losses: the PPO/GRPO clipped surrogate with every variant as an argument, and the value loss.

Key insight: one per-token objective covers REINFORCE, RLOO, GRPO, DAPO, Dr. GRPO, GSPO and PPO's actor:

    ratio_t = exp(logps_t - old_logps_t)                              (token level, PPO/GRPO)
            = exp(mean_t (logps_t - old_logps_t))  for every t        (sequence level, GSPO, Zheng et al. 2025)
    obj_t   = min(ratio_t * A, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A)   (Schulman et al. 2017;
                                                                                eps_high > eps_low: DAPO "clip-higher")
    obj_t   = max(obj_t, c * A)  where A < 0                          (dual clip, Ye et al. 2020, c > 1)
    loss_t  = -obj_t + beta * KL_t(pi || pi_ref) - entropy_coef * H_t
    loss    = aggregate(loss_t)

On-policy (ratio = 1) the gradient is exactly REINFORCE's ``-A * grad logps``, so the same function serves
every algorithm; the advantage estimator (``advantages.py``) is what differs. The clip zeroes the
gradient of a token when A > 0 and ratio > 1 + eps_high, or A < 0 and ratio < 1 - eps_low.

Aggregation (a named argument, ``AGGREGATIONS``), with N sequences, T_i real tokens in sequence i:

    "seq_mean_token_mean"      sum_i (1/N) (1/T_i) sum_t loss_it        original GRPO
    "token_mean"               sum_i sum_t loss_it / sum_i T_i          DAPO (Yu et al. 2025), TRL "dapo"
    "seq_mean_token_sum_norm"  sum_i sum_t loss_it / (N * max_len)      Dr. GRPO (Liu et al. 2025)
    "seq_mean_token_sum"       sum_i (1/N) sum_t loss_it                LUSPO (with ratio_level="sequence": each
                                                                        sequence's loss scaled by its length), TRL "luspo"

The objective itself is a named argument too (``objective``, :mod:`posttrain.losses.policy_objectives`): the
clipped surrogate above, or CISPO, SAPO, VESPO. ``kl_bias_correction`` multiplies the KL term by the ratio,
beta * r_t * KL_t (DeepSeek-V3.2; TRL's ``use_bias_correction_kl``): under samples from pi_old,
E[r k3] = E_pi[k3], so the KL term's gradient is the unbiased reverse-KL gradient even off-policy.

Micro-batch invariance: each mode is a *sum over sequences* with weights that depend only on the sequence
itself and on batch-global constants (N, sum_i T_i, max_len). The trainer computes those once on the full
batch with :func:`batch_normalizers` and passes them to every micro-batch call; each call then returns its
share, and the shares sum to the full-batch loss (and gradient) however the batch is split. Accumulate
with ``loss.backward()`` per micro-batch and no extra division. (TRL's "grpo"/"bnpo"/"dr_grpo" divide a
per-micro-batch mean by the number of accumulation steps instead, which is invariant only when every
micro-batch has the same shape and token count.) Metrics are per micro-batch; :func:`merge_metrics`
combines them into the full-batch values.

Pure tensor functions: no models, no configs. ``logps`` carry the gradient; everything else is a constant.
"""

from __future__ import annotations

import math

import torch

from posttrain.errors import ConfigError
from posttrain.losses.kl import kl_estimate
from posttrain.losses.logprobs import masked_mean
from posttrain.losses.policy_objectives import (
    CLIPPED_SIDES,
    OBJECTIVE_METRICS,
    OBJECTIVE_OPTIONS,
    POLICY_OBJECTIVES,
    clip_objective,
)

_MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: keeps inf/NaN out of the loss when a token's probability collapses


# --------------------------------------------------------------------------------------------- aggregation


def _seq_mean_token_mean(x, mask, num_seqs, num_tokens, max_len):
    per_seq = (x * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)  # (B,)
    return per_seq.sum() / num_seqs


def _token_mean(x, mask, num_seqs, num_tokens, max_len):
    return (x * mask).sum() / num_tokens


def _seq_mean_token_sum_norm(x, mask, num_seqs, num_tokens, max_len):
    return (x * mask).sum() / (num_seqs * max_len)


def _seq_mean_token_sum(x, mask, num_seqs, num_tokens, max_len):
    return (x * mask).sum() / num_seqs


AGGREGATIONS = {
    "seq_mean_token_mean": _seq_mean_token_mean,
    "token_mean": _token_mean,
    "seq_mean_token_sum_norm": _seq_mean_token_sum_norm,
    "seq_mean_token_sum": _seq_mean_token_sum,
}


def batch_normalizers(mask: torch.Tensor, max_len: int | None = None) -> dict:
    """The global constants of a FULL batch, to pass to every micro-batch's loss call.

    mask (B, T) -> {"num_seqs": B, "num_tokens": sum(mask), "max_len": max_len or T}.
    Example: mask [[1,1,0],[1,0,0]] -> {"num_seqs": 2, "num_tokens": 3, "max_len": 3}.
    """
    return {
        "num_seqs": int(mask.shape[0]),
        "num_tokens": max(float(mask.sum().item()), 1.0),
        "max_len": int(max_len if max_len is not None else mask.shape[-1]),
    }


def aggregate(
    x: torch.Tensor,
    mask: torch.Tensor,
    agg: str = "seq_mean_token_mean",
    *,
    num_seqs: float | None = None,
    num_tokens: float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Reduce per-token values (B, T) to a scalar with mode ``agg``; normalizers default to this batch's own.

    Pass the full batch's :func:`batch_normalizers` when ``x`` is one micro-batch of it.
    Example: x=[[1,3],[5,0]], mask=[[1,1],[1,0]] -> seq_mean_token_mean (2+5)/2=3.5, token_mean 9/3=3,
    seq_mean_token_sum_norm 9/(2*2)=2.25.
    """
    if agg not in AGGREGATIONS:
        raise ConfigError(f"loss aggregation {agg!r} is not valid; choose one of: {', '.join(AGGREGATIONS)}")
    if x.shape != mask.shape:
        raise ValueError(f"per-token values {tuple(x.shape)} and mask {tuple(mask.shape)} differ in shape")
    mask = mask.to(x.dtype)
    local = batch_normalizers(mask)
    num_seqs = local["num_seqs"] if num_seqs is None else num_seqs
    num_tokens = local["num_tokens"] if num_tokens is None else num_tokens
    max_len = local["max_len"] if max_len is None else max_len
    if num_seqs <= 0 or num_tokens <= 0 or max_len <= 0:
        raise ValueError(
            f"normalizers must be positive (num_seqs={num_seqs}, num_tokens={num_tokens}, max_len={max_len})"
        )
    return AGGREGATIONS[agg](x, mask, num_seqs, num_tokens, max_len)


# --------------------------------------------------------------------------------------------- policy loss


def _log_ratio(logps, old_logps, mask, ratio_level):
    log_ratio = logps - old_logps  # (B, T)
    if ratio_level == "token":
        return log_ratio
    if ratio_level == "sequence":  # GSPO: geometric mean of the token ratios, broadcast over the sequence
        seq = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp_min(1.0)  # (B, 1)
        return seq.expand_as(log_ratio)
    raise ConfigError(f"ratio_level={ratio_level!r} is not valid; choose one of: token, sequence")


def policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps_low: float | None = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    ratio_level: str = "token",
    agg: str = "seq_mean_token_mean",
    num_seqs: float | None = None,
    num_tokens: float | None = None,
    max_len: int | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    ref_logps: torch.Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: str = "k3",
    objective: str = "clip",
    objective_kwargs: dict | None = None,
    kl_bias_correction: bool = False,
    is_weights: torch.Tensor | None = None,
):
    """Clipped policy-gradient loss; returns ``(loss, metrics)``.

    logps (B, T): log-probs under the current policy (with grad). old_logps (B, T): at sampling time
    (pi_old, constant). advantages: (B,) per sequence or (B, T) per token. mask (B, T): 1 on completion tokens.
    clip_eps_low / clip_eps_high: the clip range [1 - low, 1 + high] (high defaults to low; low=None: no clip).
    dual_clip: c > 1 caps the loss of A < 0 tokens at -c * A. ratio_level: "token" or "sequence" (GSPO).
    agg, num_seqs, num_tokens, max_len: see :func:`aggregate` (pass the full batch's normalizers per micro-batch).
    entropy (B, T) and entropy_coef: bonus -coef * H. ref_logps and beta: KL(pi || ref) penalty with
    ``kl_estimator`` (k1/k2/k3); KL is reported whenever ``ref_logps`` is given, even with beta = 0.
    objective: a key of ``POLICY_OBJECTIVES`` (clip | cispo | sapo | vespo), its options in ``objective_kwargs``.
    kl_bias_correction: KL_t * ratio_t (TRL's use_bias_correction_kl; the reported ``kl`` is the corrected one, as TRL's).
    is_weights (B, T): truncated importance weights pi_old / pi_sampler (:mod:`posttrain.losses.importance`),
    constants multiplying the per-token policy term (not the KL or entropy terms, as TRL); None = no correction.

    Example: logps - old_logps = 1 (ratio = e), A = 1, eps = 0.2 -> clipped to 1.2 -> loss = -1.2, zero gradient.
    """
    _check_policy_inputs(logps, old_logps, mask, dual_clip, beta, ref_logps)
    opts = _objective_options(objective, objective_kwargs)
    mask = mask.to(logps.dtype)
    adv = (advantages[:, None] if advantages.dim() == 1 else advantages).to(logps.dtype).detach()  # (B, 1|T)
    old_logps = old_logps.detach()
    norms = dict(num_seqs=num_seqs, num_tokens=num_tokens, max_len=max_len)

    log_ratio = _log_ratio(logps, old_logps, mask, ratio_level).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)  # (B, T)
    ratio = log_ratio.exp()  # (B, T)
    lo, hi = _clip_range(clip_eps_low, clip_eps_high)
    pg_tok = POLICY_OBJECTIVES[objective](
        logps=logps, old_logps=old_logps, ratio=ratio, adv=adv, mask=mask, lo=lo, hi=hi, dual_clip=dual_clip, **opts
    )  # (B, T)
    if is_weights is not None:
        pg_tok = pg_tok * is_weights.detach().to(pg_tok.dtype)
    total_tok = pg_tok
    kl_tok = kl_estimate(logps, ref_logps.detach(), kl_estimator) if ref_logps is not None else None  # (B, T)
    if kl_tok is not None and kl_bias_correction:
        kl_tok = kl_tok * ratio  # the ratio keeps its gradient, as in TRL
    clip_lo, clip_hi = CLIPPED_SIDES[objective]
    lo_m, hi_m = (lo if clip_lo else None), (hi if clip_hi else None)
    if kl_tok is not None and beta != 0.0:
        total_tok = total_tok + beta * kl_tok
    if entropy is not None and entropy_coef != 0.0:
        total_tok = total_tok - entropy_coef * entropy
    loss = aggregate(total_tok, mask, agg, **norms)
    with torch.no_grad():
        metrics = _policy_metrics(
            loss,
            pg_tok,
            ratio,
            logps,
            old_logps,
            adv,
            mask,
            lo_m,
            hi_m,
            dual_clip,
            kl_tok,
            beta,
            entropy,
            entropy_coef,
            agg,
            norms,
        )
        if objective in OBJECTIVE_METRICS:
            metrics.update(OBJECTIVE_METRICS[objective](logps=logps, old_logps=old_logps, adv=adv, mask=mask, **opts))
    return loss, metrics


def _check_policy_inputs(logps, old_logps, mask, dual_clip, beta, ref_logps) -> None:
    if not (logps.shape == old_logps.shape == mask.shape) or logps.dim() != 2:
        raise ValueError(
            f"logps, old_logps, mask must share a (B, T) shape; got {logps.shape}, {old_logps.shape}, {mask.shape}"
        )
    if dual_clip is not None and dual_clip <= 1.0:
        raise ConfigError(f"dual_clip={dual_clip} must be > 1 (Ye et al. 2020 use 3)")
    if beta != 0.0 and ref_logps is None:
        raise ValueError("beta != 0 needs ref_logps (reference-model log-probs)")


def _objective_options(objective: str, kwargs: dict | None) -> dict:
    if objective not in POLICY_OBJECTIVES:
        raise ConfigError(f"objective={objective!r} is not valid; choose one of: {', '.join(POLICY_OBJECTIVES)}")
    kwargs = dict(kwargs or {})
    unknown = sorted(set(kwargs) - set(OBJECTIVE_OPTIONS[objective]))
    if unknown:
        raise ConfigError(
            f"objective {objective!r} takes no option {unknown}; its options: "
            f"{', '.join(OBJECTIVE_OPTIONS[objective]) or '(none)'}"
        )
    return kwargs


def _clip_range(clip_eps_low: float | None, clip_eps_high: float | None) -> tuple[float | None, float | None]:
    """(low, high) of the clip range [1 - low, 1 + high]; high defaults to low; (None, None): no clip."""
    if clip_eps_low is None:
        return None, None
    return clip_eps_low, clip_eps_low if clip_eps_high is None else clip_eps_high


def clipped_objective(
    ratio: torch.Tensor, adv: torch.Tensor, lo: float | None, hi: float | None, dual_clip: float | None = None
) -> torch.Tensor:
    """PPO's pessimistic surrogate per token, ``min(r A, clip(r, 1 - lo, 1 + hi) A)`` (no clip when ``lo`` is
    None), and with ``dual_clip`` c the objective of an A < 0 token is floored at c A. (B, T) -> (B, T)."""
    return -clip_objective(ratio=ratio, adv=adv, lo=lo, hi=hi, dual_clip=dual_clip)


def _policy_metrics(
    loss, pg_tok, ratio, logps, old_logps, adv, mask, lo, hi, dual_clip, kl_tok, beta, entropy, entropy_coef, agg, norms
) -> dict[str, float]:
    """The loss's parts and the ratio statistics, per-token means over the mask (:func:`masked_mean`)."""

    def mean(x):
        return masked_mean(x, mask).item()

    tok_log_ratio = (logps - old_logps).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    real = mask > 0
    metrics = {
        "loss": loss.item(),
        "pg_loss": aggregate(pg_tok, mask, agg, **norms).item(),
        "num_tokens": mask.sum().item(),
        "num_seqs": float(mask.shape[0]),
        "ratio_mean": mean(ratio),
        "ratio_max": ratio[real].max().item() if real.any() else 1.0,
        "ratio_min": ratio[real].min().item() if real.any() else 1.0,
        "approx_kl": mean(tok_log_ratio.exp() - 1.0 - tok_log_ratio),  # k3 of KL(pi_old || pi)
        "clip_frac_low": mean(((ratio < 1.0 - lo) & (adv < 0)).to(mask.dtype)) if lo is not None else 0.0,
        "clip_frac_high": mean(((ratio > 1.0 + hi) & (adv > 0)).to(mask.dtype)) if hi is not None else 0.0,
    }
    if dual_clip is not None:
        metrics["dual_clip_frac"] = mean(((ratio > dual_clip) & (adv < 0)).to(mask.dtype))
    if kl_tok is not None:
        metrics["kl"] = mean(kl_tok)
        metrics["kl_loss"] = aggregate(beta * kl_tok, mask, agg, **norms).item()
    if entropy is not None:
        metrics["entropy"] = mean(entropy)
        metrics["entropy_loss"] = aggregate(-entropy_coef * entropy, mask, agg, **norms).item()
    return metrics


# --------------------------------------------------------------------------------------------- value loss


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float | None = 0.2,
    agg: str = "token_mean",
    num_seqs: float | None = None,
    num_tokens: float | None = None,
    max_len: int | None = None,
):
    """PPO's clipped value loss: 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2).

    values (B, T) with grad; old_values, returns (B, T) constants; ``clip_eps=None`` drops the clip.
    Returns ``(loss, metrics)``; same aggregation and micro-batch contract as :func:`policy_loss`.
    Example: V=2, V_old=1, R=0, eps=.5 -> max(4, 1.5^2) / 2 = 2.
    """
    if not (values.shape == old_values.shape == returns.shape == mask.shape):
        raise ValueError("values, old_values, returns and mask must share a shape")
    mask = mask.to(values.dtype)
    old_values, returns = old_values.detach(), returns.detach()
    err = (values - returns) ** 2  # (B, T)
    if clip_eps is not None:
        clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)  # (B, T)
        err_clipped = (clipped - returns) ** 2
        per_tok = 0.5 * torch.maximum(err, err_clipped)
    else:
        err_clipped, per_tok = err, 0.5 * err
    loss = aggregate(per_tok, mask, agg, num_seqs=num_seqs, num_tokens=num_tokens, max_len=max_len)
    with torch.no_grad():
        n = mask.sum().clamp_min(1.0)
        metrics = {
            "value_loss": loss.item(),
            "num_tokens": mask.sum().item(),
            "value_mean": ((values * mask).sum() / n).item(),
            "value_clip_frac": (((err_clipped > err).to(mask.dtype) * mask).sum() / n).item(),
            "value_mse": ((err * mask).sum() / n).item(),
        }
    return loss, metrics


# --------------------------------------------------------------------------------------------- metrics


_SUM_KEYS = {"loss", "pg_loss", "kl_loss", "entropy_loss", "value_loss", "num_tokens", "num_seqs"}


def merge_metrics(parts: list[dict]) -> dict:
    """Combine the metrics of a batch's micro-batches into the full batch's.

    Loss shares and counts add up; ``*_max`` / ``*_min`` take the max / min; every other entry is a
    per-token mean, weighted by each part's ``num_tokens``.
    """
    if not parts:
        return {}
    out = {}
    weights = [p.get("num_tokens", 1.0) for p in parts]
    total = sum(weights)
    for key in parts[0]:
        vals = [p[key] for p in parts]
        if key in _SUM_KEYS:
            out[key] = sum(vals)
        elif key.endswith("_max"):
            out[key] = max(vals)
        elif key.endswith("_min"):
            out[key] = min(vals)
        else:
            out[key] = sum(v * w for v, w in zip(vals, weights)) / total if total > 0 else math.nan
    return out
