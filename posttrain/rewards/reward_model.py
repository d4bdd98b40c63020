"""The reward-model reward: load a ``posttrain rm`` checkpoint and score (prompt, completion) pairs with it.

Key insight: a trained reward model is just another reward function, ``fn(prompts, completions) ->
list[float]``: [BOS] prompt | completion [EOS] goes through the backbone, the scalar head reads the last
real token, and the saved mean/std (:class:`~posttrain.models.heads.RewardStats`) z-score it, so RL sees
rewards of unit scale whatever offset Bradley-Terry left.

The registry (:mod:`posttrain.rewards.registry`) lists ``reward_model`` literally and imports this module
only when that reward is built (it needs torch and a checkpoint reader; ``posttrain --help`` needs neither).
:func:`reward_model_reward` is the one constructor every consumer uses (``build_reward(spec, rm_path=...)`` in
the RL trainers, ``posttrain eval --best-of N --reward-model RM``): it loads the checkpoint once and returns a
scorer that reuses it for every call.

Layering: the checkpoint reader is :func:`posttrain.checkpoints.load.load_checkpoint`, below both this module and
the trainers (which write checkpoints); nothing here imports a trainer.

Training the model is :mod:`posttrain.trainers.reward`; the checkpoint format (a backbone LM checkpoint +
``reward_head.safetensors`` + ``reward_stats.json``, one atomic directory) is read here; it is written by
:func:`posttrain.trainers.checkpoint.save_reward_checkpoint` (writing checkpoints is the trainers').

Not handled: reward ensembles, HF ``AutoModelForSequenceClassification`` checkpoints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from posttrain.checkpoints.files import reading
from posttrain.checkpoints.layout import REWARD_HEAD_FILE
from posttrain.checkpoints.load import REWARD_MODEL, load_checkpoint
from posttrain.data.preference import encode_completion, encode_prompt, pack_prompt_completion
from posttrain.errors import ConfigError, UserError
from posttrain.models.heads import REWARD_STATS_FILE, RewardModel, RewardStats

HEAD_FILE = REWARD_HEAD_FILE


@dataclass
class LoadedRewardModel:
    """A reward model ready to score text: ``rewards = loaded(prompts, completions)`` (list of floats)."""

    model: RewardModel
    tokenizer: object
    stats: RewardStats | None
    path: Path
    state: dict = dataclasses.field(default_factory=dict)

    @torch.no_grad()
    def score(
        self, prompts: Sequence[str], completions: Sequence[str], normalize: bool = False, batch_size: int = 256
    ) -> torch.Tensor:
        """Rewards (N,) of [BOS] prompt | completion [EOS], z-scored with the saved stats if ``normalize``."""
        if len(prompts) != len(completions):
            raise UserError(f"{len(prompts)} prompts for {len(completions)} completions")
        if normalize and self.stats is None:
            raise UserError(f"{self.path} has no {REWARD_STATS_FILE}: cannot normalise rewards")
        self.model.eval()
        tok, out = self.tokenizer, []
        pad = tok.pad_id if tok.pad_id is not None else 0
        for s in range(0, len(prompts), batch_size):
            b = pack_prompt_completion(
                [encode_prompt(tok, p) for p in prompts[s : s + batch_size]],
                [encode_completion(tok, c) for c in completions[s : s + batch_size]],
                pad,
            )
            out.append(self.model(b["input_ids"], b["attention_mask"]))
        r = torch.cat(out) if out else torch.zeros(0)
        return self.stats.normalize(r) if normalize else r

    def __call__(self, prompts: list[str], completions: list[str], normalize: bool = True, **columns) -> list[float]:
        return self.score(prompts, completions, normalize=normalize).tolist()


def load_reward_model(
    path: str | Path, device: str = "cpu", with_training_state: bool = False, prefer_latest: bool = False
) -> LoadedRewardModel:
    """Rebuild a reward model saved by ``posttrain rm`` (a checkpoint or run directory) in eval mode."""
    ckpt = load_checkpoint(path, device=device, prefer_latest=prefer_latest, accept_kinds=REWARD_MODEL)
    p = ckpt.path
    rm = RewardModel(ckpt.model)
    with reading(p / HEAD_FILE):
        rm.head.load_state_dict(load_file(str(p / HEAD_FILE), device=str(device)))
    stats = RewardStats.load(p) if (p / REWARD_STATS_FILE).is_file() else None
    return LoadedRewardModel(model=rm.eval(), tokenizer=ckpt.tokenizer, stats=stats, path=p, state=ckpt.state)


def reward_model_reward(rm_path: str | None = None, rm_normalize: bool = True, **_):
    """Reward-registry factory: ``get_reward("reward_model", rm_path=DIR)`` -> fn(prompts, completions)."""
    if not rm_path:
        raise ConfigError("the reward_model reward needs rm_path (a `posttrain rm` output directory)")
    loaded = load_reward_model(rm_path)

    def reward_model(prompts: list[str], completions: list[str], **columns) -> list[float]:
        return loaded(prompts, completions, normalize=rm_normalize)

    return reward_model
