"""Value models for PPO: a per-token scalar head V(s_t) on a backbone, as a separate critic or on the policy.

Key insight: PPO's critic predicts, for every prefix s_t = (prompt, y_<t), the expected return from there.
In a causal LM the hidden state at position i has seen tokens 0..i, so the value of the state *before*
completion token t is read at position P - 1 + t (the position whose logits predict y_t), exactly where the
policy's log-prob of y_t is read:

    h = backbone(input_ids, attention_mask, position_ids)    # (B, P + T, D)
    V[:, t] = w . h[:, P - 1 + t] + c,   t = 0..T-1             # (B, T), 0 where completion_mask = 0

Two layouts (``value_model``): ``separate``, a critic with its own backbone (a copy of the policy, or of a
reward model's backbone: the literature's default, "N+ implementation details of RLHF with PPO", OpenRLHF),
and ``shared``, a head on the policy's own final hidden states (one forward for both; the value loss then
also trains the policy's backbone). The head starts from the reward model's scalar head when there is one
(the RM scores whole sequences, a fair first guess of the value of each prefix), else at zero (V = 0).

Values at padding and after EOS are masked to exactly 0 everywhere (:func:`completion_values`).
Not handled: value heads on Hugging Face models through ``shared`` (they need the LM's hidden states and
logits from one call: posttrain's GPT gives both; ``separate`` works with any backbone of ``heads.as_backbone``).
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from posttrain.models.heads import as_backbone, positions_from_mask
from posttrain.ops.thread_invariant import Linear


class ValueHead(nn.Module):
    """Linear D -> 1 at every position: (B, T, D) -> (B, T). Zero-initialised (V = 0) unless copied from an RM head."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = Linear(hidden_size, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden.to(self.proj.weight.dtype)).squeeze(-1)

    def copy_from(self, linear: nn.Linear, scale: float = 1.0, shift: float = 0.0) -> "ValueHead":
        """Start from a reward model's ``ScalarHead.proj`` (same D -> 1 shape), as ``V = scale * RM + shift``: with
        an RM's saved statistics and the reward's weight w, ``scale = w / std`` and ``shift = -w * mean / std`` put
        the values in the units of the z-scored reward ``w * (RM - mean) / std`` instead of the RM's raw scale."""
        with torch.no_grad():
            self.proj.weight.copy_(linear.weight * scale)
            self.proj.bias.copy_(linear.bias * scale + shift)
        return self


def completion_values(
    values: torch.Tensor, completion_start: int, completion_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-position values (B, P + T) -> the completion's state values (B, T): positions P-1 .. P+T-2, masked.

    Example: P = 2, values [[a, b, c, d]] (T = 2) -> [[b, c]]; with completion_mask [[1, 0]] -> [[b, 0]].
    """
    v = values[:, completion_start - 1 : -1]
    if completion_mask is not None:
        v = torch.where(completion_mask.bool(), v, torch.zeros_like(v))
    return v


class ValueModel(nn.Module):
    """A separate critic: backbone + :class:`ValueHead`; ``critic(ids, mask, P, completion_mask) -> V (B, T)``."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = as_backbone(backbone)
        self.head = ValueHead(self.backbone.hidden_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        completion_start: int,
        completion_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if position_ids is None:
            position_ids = positions_from_mask(attention_mask)
        hidden = self.backbone(input_ids, attention_mask, position_ids)  # (B, P + T, D)
        return completion_values(self.head(hidden), completion_start, completion_mask)

    @classmethod
    def from_policy(cls, policy: nn.Module) -> "ValueModel":
        """A critic on a deep copy of the policy's network (the policy itself is untouched), V = 0 at start."""
        return cls(copy.deepcopy(policy))

    @classmethod
    def from_reward_model(cls, reward_model: nn.Module, scale: float = 1.0, shift: float = 0.0) -> "ValueModel":
        """A critic on a deep copy of a ``heads.RewardModel``'s backbone, its head copied from the RM's scalar head
        (``V = scale * RM + shift``, :meth:`ValueHead.copy_from`)."""
        critic = cls(copy.deepcopy(reward_model.backbone))
        critic.head.copy_from(reward_model.head.proj, scale, shift)
        return critic


def shared_forward(
    policy: nn.Module,
    head: ValueHead,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
):
    """One policy forward giving both the logits (B, L, V) and the per-position values (B, L) of ``head`` on
    its final hidden states (``shared`` layout; posttrain's GPT: ``output_hidden_states=True``)."""
    out = policy(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, output_hidden_states=True
    )
    hidden = getattr(out, "hidden_states", None)
    if hidden is None:
        raise TypeError(f"{type(policy).__name__} returned no hidden states: value_model=shared needs posttrain's GPT")
    if isinstance(hidden, (tuple, list)):  # Hugging Face: one tensor per layer, the last is the final one
        hidden = hidden[-1]
    return out.logits, head(hidden)
