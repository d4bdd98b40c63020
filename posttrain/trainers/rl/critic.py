"""PPO's value model: V(s_t) per completion token, built from the starting policy or a reward model, and kept beside
the policy in a checkpoint.

Key insight: the critic's start sets how much of the first updates' advantage is noise. A zero head (``policy``)
gives V = 0, so the first advantages are the REINFORCE returns; a reward model's head (``reward_model``) starts V in
the reward's units (scaled by ``critic_scale``: the RM's score statistics), close to the returns it must predict:

    value_model=separate: V = head(backbone(x))     a copy of the policy (or of the RM), trained by its own AdamW
    value_model=shared:   V = head(h_policy(x))     one head on the policy's hidden states (no second backbone)

In a checkpoint: ``critic.safetensors`` (weights) and ``critic_optimizer.pt`` (its AdamW state), beside the policy's
files; a sharded (FSDP) checkpoint holds them among its shards instead. Not handled: a critic on another tokenizer
than the policy's, a shared head on a Hugging Face model.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from posttrain.checkpoints.files import load_tensors, load_torch_state
from posttrain.errors import UserError
from posttrain.models.value import ValueHead, ValueModel

# beside the policy in a PPO checkpoint
CRITIC_FILE, CRITIC_OPTIMIZER_FILE = "critic.safetensors", "critic_optimizer.pt"


def build_critic(cfg, init_model) -> tuple[ValueModel | None, ValueHead | None]:
    """-> (critic, shared_head), one of them None: from ``init_model`` (the starting policy, before LoRA: a copy of
    plain weights) with a zero head, or from the reward model at ``cfg.critic_init_path``."""
    if cfg.critic_source != "reward_model":  # a zero head on the policy (shared) or on a copy of it
        if cfg.value_model == "shared":
            return None, ValueHead(int(init_model.config.d_model))
        return ValueModel.from_policy(init_model).train(), None
    from posttrain.rewards.reward_model import load_reward_model  # lazy: a checkpoint reader

    loaded = load_reward_model(cfg.critic_init_path)
    rm, (scale, shift) = loaded.model, cfg.critic_scale(loaded.stats)  # V in the reward's units
    if cfg.value_model == "shared":
        return None, ValueHead(int(init_model.config.d_model)).copy_from(rm.head.proj, scale, shift)
    return ValueModel.from_reward_model(rm, scale, shift).train(), None


def save_critic(directory: Path, critic: torch.nn.Module, optimizer=None) -> None:
    """The critic's weights (and its optimizer's state, when given) into the checkpoint being written."""
    save_file(
        {k: v.detach().clone().contiguous() for k, v in critic.state_dict().items()}, str(directory / CRITIC_FILE)
    )
    if optimizer is not None:
        torch.save(optimizer.state_dict(), directory / CRITIC_OPTIMIZER_FILE)


def load_critic(directory: Path, critic: torch.nn.Module, optimizer) -> None:
    """The critic and its optimizer from a plain checkpoint; a missing, corrupt or pickled file is one line naming it."""
    try:
        critic.load_state_dict(load_tensors(directory / CRITIC_FILE))
        optimizer.load_state_dict(load_torch_state(directory / CRITIC_OPTIMIZER_FILE))
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        raise UserError(
            f"{directory}: no usable critic ({CRITIC_FILE}, {CRITIC_OPTIMIZER_FILE}): {str(e).splitlines()[0]}"
        ) from None
