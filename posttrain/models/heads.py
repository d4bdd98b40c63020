"""Scalar heads on a backbone: reward models, their normalisation statistics, best-of-N and RM ensembles.

Key insight: a reward model is a language model's last hidden state read at the *last real token*
(the one that has seen the whole prompt and response) through a linear map D -> 1:

    h = backbone(input_ids, attention_mask, position_ids)       # (B, T, D)
    i_b = max { t : attention_mask[b, t] = 1 }                   # last real token, any padding side
    r_b = w . h[b, i_b] + c                                      # (B,)

Reading ``h[:, -1]`` is wrong under right padding (a pad token) and reading the first pad is wrong under
left padding; the index above is right for both, and for masks with holes in the middle.

The backbone is a small protocol, :class:`Backbone`: a module called as
``backbone(input_ids, attention_mask, position_ids) -> (B, T, D)`` with a ``hidden_size`` attribute.
Adapters: :class:`GPTBackbone` for posttrain's GPT and :class:`HFBackbone` for any Hugging Face model
(causal LM or encoder; it runs ``model.base_model``, so no vocabulary projection is computed).
:func:`as_backbone` picks one.

Not handled here: training (``trainers/reward.py``), value heads with a per-token output (PPO), and
checkpoint layout beyond the ``reward_stats.json`` written by :class:`RewardStats`.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
import torch.nn as nn

from posttrain.errors import DataError
from posttrain.ops.thread_invariant import Linear

REWARD_STATS_FILE = "reward_stats.json"


# ---------------------------------------------------------------------------------------------
# backbones


@runtime_checkable
class Backbone(Protocol):
    """``backbone(input_ids (B,T), attention_mask (B,T), position_ids (B,T)) -> hidden (B,T,D)``."""

    hidden_size: int

    def __call__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor: ...


class GPTBackbone(nn.Module):
    """posttrain's GPT as a backbone: its final-norm hidden states (``output_hidden_states=True``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.hidden_size = int(model.config.d_model)

    def forward(self, input_ids, attention_mask, position_ids):
        out = self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids, output_hidden_states=True)
        return out.hidden_states  # (B, T, D)


class HFBackbone(nn.Module):
    """A Hugging Face model as a backbone: ``model.base_model(...).last_hidden_state``.

    For a causal LM (``GPT2LMHeadModel``) ``base_model`` is the transformer without the LM head, and its
    last hidden state is the same tensor as ``output_hidden_states=True``'s ``hidden_states[-1]``
    (after the final layer norm), without computing logits. Encoders (BERT-like) work the same way.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.hidden_size = int(model.config.hidden_size)
        # a few encoders (DistilBERT) take no position_ids; they then assume right padding
        self.takes_position_ids = "position_ids" in inspect.signature(model.base_model.forward).parameters

    def forward(self, input_ids, attention_mask, position_ids):
        kw = {"position_ids": position_ids} if self.takes_position_ids else {}
        out = self.model.base_model(input_ids=input_ids, attention_mask=attention_mask, **kw)
        return out.last_hidden_state  # (B, T, D)


def as_backbone(model: nn.Module) -> nn.Module:
    """Wrap ``model`` in the adapter its type needs (a module already satisfying the protocol is kept)."""
    from posttrain.models.gpt import GPT

    if isinstance(model, GPT):
        return GPTBackbone(model)
    if isinstance(model, (GPTBackbone, HFBackbone)):
        return model
    try:
        from transformers import PreTrainedModel
    except ImportError:  # transformers is an optional extra
        PreTrainedModel = ()  # noqa: N806
    if PreTrainedModel and isinstance(model, PreTrainedModel):
        return HFBackbone(model)
    if isinstance(model, Backbone):
        return model
    raise TypeError(
        f"{type(model).__name__} is not a backbone: pass posttrain's GPT, a Hugging Face model, or a module "
        "with a hidden_size attribute called as backbone(input_ids, attention_mask, position_ids) -> (B, T, D)"
    )


# ---------------------------------------------------------------------------------------------
# reading the last real token


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last position with mask 1 in each row. (B, T) -> (B,).

    Example: [[0, 0, 1, 1], [1, 1, 1, 0]] -> [3, 2] (left- and right-padded).
    """
    m = attention_mask.bool()
    if not m.any(-1).all():
        raise ValueError("a row of attention_mask has no real token")
    T = m.shape[-1]
    return (T - 1) - m.flip(-1).long().argmax(-1)  # argmax finds the first True of the reversed row


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids counting real tokens only: [0, 0, 1, 1] -> [0, 0, 0, 1]. (B, T) -> (B, T)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


class ScalarHead(nn.Module):
    """Linear D -> 1 read at the last real token: (B, T, D), (B, T) -> (B,).

    Initialised N(0, 1/(D+1)) with zero bias, so initial rewards are O(1) whatever D.
    """

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = Linear(hidden_size, 1)
        nn.init.normal_(self.proj.weight, std=1.0 / math.sqrt(hidden_size + 1))
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        idx = last_token_index(attention_mask)  # (B,)
        last = hidden[torch.arange(hidden.shape[0], device=hidden.device), idx]  # (B, D)
        return self.proj(last.to(self.proj.weight.dtype)).squeeze(-1)  # (B,)


class RewardModel(nn.Module):
    """backbone + :class:`ScalarHead`: ``rm(input_ids, attention_mask) -> rewards (B,)``.

    ``position_ids`` default to :func:`positions_from_mask`, so left-padded and right-padded copies of
    the same sequences get the same rewards.
    """

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = as_backbone(backbone)
        self.head = ScalarHead(self.backbone.hidden_size)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        if position_ids is None:
            position_ids = positions_from_mask(attention_mask)
        hidden = self.backbone(input_ids, attention_mask, position_ids)  # (B, T, D)
        return self.head(hidden, attention_mask)  # (B,)


# ---------------------------------------------------------------------------------------------
# normalisation, best-of-N, ensembles


@dataclass(frozen=True)
class RewardStats:
    """Mean/std of an RM's rewards over a prompt set, saved beside its checkpoint so RL can z-score.

    ``normalize(r) = (r - mean) / std`` (std floored at 1e-8). Saved as ``reward_stats.json``.
    """

    mean: float
    std: float
    count: int

    @classmethod
    def from_rewards(cls, rewards: torch.Tensor) -> "RewardStats":
        r = rewards.detach().double().flatten()
        if r.numel() == 0:
            raise ValueError("RewardStats.from_rewards needs at least one reward")
        std = float(r.std()) if r.numel() > 1 else 0.0
        return cls(mean=float(r.mean()), std=std, count=int(r.numel()))

    def normalize(self, rewards: torch.Tensor) -> torch.Tensor:
        return (rewards - self.mean) / max(self.std, 1e-8)

    def save(self, path: str | Path) -> Path:
        """Write to ``path`` (a directory gets ``reward_stats.json`` inside it). Returns the file path."""
        from posttrain.data.io import atomic_write_json

        p = Path(path)
        if p.is_dir():
            p = p / REWARD_STATS_FILE
        atomic_write_json(p, asdict(self))
        return p

    @classmethod
    def load(cls, path: str | Path) -> "RewardStats":
        p = Path(path)
        if p.is_dir():
            p = p / REWARD_STATS_FILE
        if not p.exists():
            raise DataError(f"reward statistics not found: {p}")
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
            return cls(mean=float(d["mean"]), std=float(d["std"]), count=int(d["count"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise DataError(f"{p}: not a reward statistics file (needs mean, std, count): {e}") from None


@torch.no_grad()
def reward_stats_over(
    rm: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, batch_size: int = 64
) -> RewardStats:
    """Score (prompt + response) sequences with ``rm`` in eval mode, in batches, and summarise them."""
    was_training = rm.training
    rm.eval()
    try:
        rewards = torch.cat(
            [
                rm(input_ids[i : i + batch_size], attention_mask[i : i + batch_size])
                for i in range(0, len(input_ids), batch_size)
            ]
        )
    finally:
        rm.train(was_training)
    return RewardStats.from_rewards(rewards)


def best_of_n(rewards: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the highest-reward candidate of each group of ``n`` consecutive ones.

    ``rewards`` (B*n,) is laid out prompt-major (candidates of prompt 0, then prompt 1, ...), as the
    sampler returns ``n`` samples per prompt. Returns (flat indices (B,), best rewards (B,)); ties go to
    the first candidate. Example: rewards [1, 3, 2, 0, 5, 5], n=3 -> indices [1, 4], rewards [3, 5].
    """
    if rewards.dim() != 1 or n < 1 or rewards.numel() % n:
        raise ValueError(f"rewards must be 1-D with a length divisible by n={n}, got shape {tuple(rewards.shape)}")
    grouped = rewards.view(-1, n)  # (B, n)
    best, j = grouped.max(-1)  # (B,), (B,)  -- max returns the first maximal index
    return torch.arange(grouped.shape[0], device=rewards.device) * n + j, best


def weighted_best_of_n(rewards: torch.Tensor, answers: Sequence[str], n: int) -> torch.Tensor:
    """Best-of-N weighted: pick the *answer* the RM's scores favour in total, not the single top-scored sample.

    Snell et al. 2024 ("best-of-N weighted", sec. 5) and Uesato et al. 2022 (RM-weighted majority voting): samples
    that give the same answer pool their weight. With Bradley-Terry scores the weight of sample j of a group is
    softmax(r)_j, the model's probability that j is the group's best, so an answer's total is the probability that
    the best sample gives it:

        a* = argmax_a  sum_{j: answer_j = a} exp(r_j) / sum_k exp(r_k),   pick = the best-scored sample with a*

    ``rewards`` (B*n,) and ``answers`` (B*n,) prompt-major as in :func:`best_of_n`, answers compared after stripping
    surrounding whitespace (as the exact-match verifier does); ties (totals within 1e-12,
    equal scores) go to the first. Returns flat indices (B,). One sample per answer reduces to :func:`best_of_n`; equal
    scores to a majority vote. Example: rewards [2, 1.5, 1.5, 0], answers ["7", "8", "8", "8"], n=4 -> softmax
    weights .43/.26/.26/.06, "8" totals .57 > .43: pick index 1 (plain best-of-N would pick 0).
    """
    if rewards.dim() != 1 or n < 1 or rewards.numel() % n or len(answers) != rewards.numel():
        raise ValueError(
            f"rewards must be 1-D with a length divisible by n={n} and one answer each, got shape "
            f"{tuple(rewards.shape)} and {len(answers)} answers"
        )
    weights = torch.softmax(rewards.double().view(-1, n), dim=-1).flatten().tolist()  # (B*n,), per group
    r = rewards.tolist()
    picks = []
    for b in range(len(r) // n):
        total: dict[str, float] = {}
        best: dict[str, int] = {}
        for i in range(b * n, (b + 1) * n):
            a = answers[i].strip()
            total[a] = total.get(a, 0.0) + weights[i]
            if a not in best or r[i] > r[best[a]]:
                best[a] = i
        top = max(total.values())
        # totals within 1e-12 are a tie (sums of the same weights in another order differ in the last bits); dicts
        # keep first-seen order, so a tie goes to the answer sampled first
        winner = next(a for a in total if total[a] >= top - 1e-12)
        picks.append(best[winner])
    return torch.tensor(picks, dtype=torch.long, device=rewards.device)


def combine_rewards(
    components: dict[str, torch.Tensor], weights: dict[str, float], stats: dict[str, RewardStats] | None = None
) -> torch.Tensor:
    """sum_k w_k * z_k(r_k): a weighted sum of several RMs' rewards (e.g. helpfulness + harmlessness).

    With ``stats`` each component is z-scored first (``RewardStats.normalize``), so the weights compare
    like with like; RMs trained separately have arbitrary offsets and scales otherwise.
    Example: {"help": [1, 2], "safe": [0, 4]}, weights {"help": 1, "safe": 0.5} -> [1, 4].
    """
    if set(components) != set(weights):
        raise ValueError(f"weights name {sorted(weights)} but rewards come from {sorted(components)}")
    if stats is not None and not set(components) <= set(stats):
        raise ValueError(f"missing reward statistics for {sorted(set(components) - set(stats))}")
    total = None
    for name, r in components.items():
        z = stats[name].normalize(r) if stats is not None else r
        total = weights[name] * z if total is None else total + weights[name] * z
    return total


class RewardEnsemble(nn.Module):
    """Several reward models scored on the same batch and combined by :func:`combine_rewards`.

    ``forward`` returns the combined reward (B,); ``components`` returns each model's raw rewards.
    """

    def __init__(
        self, models: dict[str, nn.Module], weights: dict[str, float], stats: dict[str, RewardStats] | None = None
    ):
        super().__init__()
        if set(models) != set(weights):
            raise ValueError(f"weights name {sorted(weights)} but the models are {sorted(models)}")
        self.models = nn.ModuleDict(models)
        self.weights = dict(weights)
        self.stats = stats

    def components(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: rm(input_ids, attention_mask) for name, rm in self.models.items()}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return combine_rewards(self.components(input_ids, attention_mask), self.weights, self.stats)
