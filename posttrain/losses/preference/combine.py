"""Weighted combinations of preference losses: L = sum_k w_k L_k (TRL's ``loss_type=[...]`` with ``loss_weights``).

MPO (Wang et al. 2024, "Enhancing the Reasoning Ability of Multimodal LLMs via Mixed Preference
Optimization") trains with ``dpo,bco_pair,sft`` weighted 0.8, 0.2, 1.0. As in TRL, every component sees the
same batch and the same keyword arguments (one beta, one label_smoothing, ...): a keyword goes to each
component whose signature has it. Metrics: the first component's (TRL logs the implicit rewards once), then
any key a later component adds, and ``loss/<name>`` = each component's unweighted loss, so that
``loss == sum_k w_k * metrics["loss/<name_k>"]``. At most one component may carry state (BCO's shift or
beta-DPO's statistics), passed as ``state``; KTO, being unpaired, cannot be combined with paired losses.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

from posttrain.losses.preference.base import Tensor


def combined_loss(components: Sequence[tuple[str, Callable, float]]) -> Callable[..., tuple[Tensor, dict[str, Tensor]]]:
    """A keyword-only loss that returns ``(sum_k w_k L_k, metrics)`` for ``components`` = [(name, fn, w_k), ...].

    Its ``inspect.signature`` is the union of the components' parameters (first default wins), so option
    checking works on it as on a single loss.
    Example: [("dpo", dpo_loss, 0.5), ("sft", sft_loss, 2.0)] at h = 0 with chosen NLL 1 -> 0.5 log 2 + 2 = 2.3466.
    """
    if not components:
        raise ValueError("combined_loss needs at least one component")
    accepts = [set(inspect.signature(fn).parameters) for _, fn, _ in components]

    def loss_fn(**kw):
        total, metrics = 0.0, {}
        for (name, fn, w), names in zip(components, accepts):
            loss, m = fn(**{k: v for k, v in kw.items() if k in names})
            total = total + w * loss
            for k, v in m.items():
                metrics.setdefault(k, v)
            metrics[f"loss/{name}"] = loss.detach()
        return total, metrics

    params: dict[str, inspect.Parameter] = {}
    for _, fn, _ in components:
        for p in inspect.signature(fn).parameters.values():
            params.setdefault(p.name, p.replace(kind=inspect.Parameter.KEYWORD_ONLY))
    loss_fn.__signature__ = inspect.Signature(
        sorted(params.values(), key=lambda p: p.default is not inspect.Parameter.empty)
    )
    loss_fn.__name__ = "combined_loss_" + "_".join(name for name, _, _ in components)
    loss_fn.__doc__ = "Weighted sum: " + " + ".join(f"{w:g} * {name}" for name, _, w in components)
    return loss_fn
