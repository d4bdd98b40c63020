"""A ``posttrain rm`` reward model as transformers' ``AutoModelForSequenceClassification`` (one label).

transformers' sequence-classification models are the causal LM's backbone (``base_model``: the transformer
without the LM head) plus ``score``, a bias-free linear map D -> num_labels read at the last non-pad token; that
is exactly our :class:`~posttrain.models.heads.RewardModel` (backbone final hidden state, last real token,
``w . h + c``) with ``score.weight = w``. So the export copies the backbone's weights unchanged and the head's
weight into ``score.weight``, and sets ``pad_token_id`` (how transformers finds the last real token):

    AutoModelForSequenceClassification.from_pretrained(DIR)(input_ids).logits[:, 0] == our reward - c

The offset ``c`` (free under Bradley-Terry: only differences are trained) has no place in the layout; it is
kept in ``config.json`` as ``posttrain_reward`` with the saved mean/std (``reward_stats.json``), so the exact
reward is ``logit + bias`` and the z-scored one ``(logit + bias - mean) / std``. TRL's PPO and GRPO take such
a model as a reward model.

Not handled: a LoRA reward model without ``--merge-lora`` (the layout has no adapter), sharded checkpoints.
"""

from __future__ import annotations

import copy

import torch


def to_sequence_classification(causal, head_weight: torch.Tensor, pad_id: int | None, extra: dict | None = None):
    """A transformers ``...ForSequenceClassification`` (num_labels=1) with ``causal``'s backbone and ``score.weight``
    = ``head_weight`` (1, D); ``extra`` is saved in its config as ``posttrain_reward``."""
    from transformers import AutoModelForSequenceClassification

    cfg = copy.deepcopy(causal.config)
    cfg.num_labels = 1
    cfg.architectures = None
    if pad_id is not None:
        cfg.pad_token_id = int(pad_id)
    if extra:
        cfg.posttrain_reward = dict(extra)
    cls = AutoModelForSequenceClassification.from_config(cfg)
    cls.base_model.load_state_dict(causal.base_model.state_dict(), strict=True)
    with torch.no_grad():
        cls.score.weight.copy_(head_weight.detach().reshape(cls.score.weight.shape).to(cls.score.weight.dtype))
    return cls.eval()
