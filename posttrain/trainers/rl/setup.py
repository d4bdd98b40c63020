"""An RL run's set-up, shared by GRPO and PPO: the starting policy (LoRA, chat template), the frozen reference, the
inputs (prompts, evaluation set, the rollout engine), the KL controller, and what a resumed run restores.

Each is a function of values (the config, the task, the run being opened by ``open_training``) except
:func:`restore`, which sets the state every RL trainer has (``kl_ctl``, ``alarms``, ``collapse``, ``snapshot``). Checks
run before the run directory is written, so a bad file, a prompt too long for the model or an engine that cannot
start is a one-line error with nothing written. Not handled here: PPO's critic (``critic.py``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from posttrain.chat import chat_tokenizer, resolve_chat
from posttrain.engines import build_engine
from posttrain.errors import ConfigError, UserError
from posttrain.losses.kl import AdaptiveKLController, FixedKLController, kl_controller_from_state
from posttrain.models.lora import apply_lora, lora_config, reference_model
from posttrain.tasks.rl import rl_data
from posttrain.trainers import common, sharded
from posttrain.trainers.checkpoint import load_snapshot


def require_start(cfg, resume: str | None, what: str) -> None:
    """RL starts from a policy: ``--init`` (an SFT run) or ``--model``, or the run being resumed."""
    if not (cfg.init or cfg.model_path) and not resume:
        raise UserError(
            f"{what} needs a starting policy: pass --init SFT_CHECKPOINT (e.g. the out dir of `posttrain sft`) "
            "or --model DIR"
        )


def policy(cfg, start):
    """-> (model, tokenizer, chat): the resumed checkpoint's policy or the --init / --model start, with LoRA adapters
    when asked; with a chat template, the tokenizer's EOS is its end-of-turn token."""
    src = start.ckpt or start.init
    model, tokenizer = apply_lora(src.model, lora_config(cfg)), src.tokenizer
    chat = resolve_chat(cfg.chat_template, tokenizer, [getattr(x, "path", None) for x in (start.ckpt, start.init)])
    return model, chat_tokenizer(tokenizer, chat), chat


def reference(cfg, model, start_model):
    """The frozen reference (None with beta = 0): a copy of ``start_model()`` (the starting policy), made before the
    policy is placed or sharded; with LoRA the policy ``model`` itself with its adapters switched off."""
    if cfg.beta <= 0:
        return None
    return reference_model(model, lambda: common.frozen(copy.deepcopy(start_model())))


@dataclass
class RLInputs:
    """The prompts and evaluation set (``data``), and what samples the rollouts."""

    data: Any  # tasks/rl.py: .train (rows with .prompt, .answer), .evals, .score, .evaluate
    fsdp: bool  # the policy is sharded: rollouts and evaluation sample from ``replica``
    replica: Any  # a whole copy of the policy, refreshed once per step (trainers/sharded.py), or None
    engine: Any  # the rollout engine (engines/): ours, vllm or the skewed test engine


def rl_inputs(cfg, task, reward_fn, chat, t) -> RLInputs:
    """Read and check the prompts and the evaluation set against ``t``'s model and tokenizer and build the rollout
    engine: before the run directory is written (``open_training``'s ``inputs``), so a bad file, a prompt too long
    for the model or an engine that cannot start is a one-line error with nothing written."""
    data = rl_data(
        task=task,
        data=cfg.data,
        eval_data=cfg.eval_data,
        reward_fn=reward_fn,
        tokenizer=t.tokenizer,
        model=t.model,
        max_new_tokens=cfg.max_new_tokens,
        prompt_field=cfg.prompt_field,
        chat=chat,
        on_bad_line=cfg.on_bad_line,
    )
    fsdp = cfg.fsdp and t.world.distributed  # then rollouts sample from a replica (trainers/sharded.py)
    replica = sharded.rollout_replica(t.model) if fsdp else None
    engine = build_engine(cfg, replica if fsdp else t.model, t.tokenizer, model_dir=cfg.model_path)
    max_len = getattr(getattr(t.model, "config", None), "max_seq_len", None)
    if max_len is not None and not cfg.data and task.max_prompt_len + 1 + cfg.max_new_tokens > max_len:
        raise UserError(f"prompt + {cfg.max_new_tokens} new tokens exceed model.max_seq_len={max_len}")
    return RLInputs(data, fsdp, replica, engine)


def check_groups_per_rank(cfg, world) -> None:
    """Under several processes each rank samples whole groups of the step's prompts, so batch-wide statistics of the
    advantages would be per rank: refused with one line (a group baseline, or one process)."""
    if not world.distributed:
        return
    if cfg.prompts_per_step % world.world_size:
        raise ConfigError(
            f"prompts_per_step={cfg.prompts_per_step} must be divisible by the number of "
            f"processes ({world.world_size}): each rank samples whole groups"
        )
    if (cfg.algo == "grpo" and cfg.scale_rewards == "batch") or (
        cfg.algo == "reinforce" and cfg.reinforce_baseline == "batch_mean"
    ):
        raise ConfigError(
            "batch-wide advantage statistics (scale_rewards=batch, reinforce_baseline=batch_mean) "
            "are per rank under several processes; use group statistics or one process"
        )


def kl_controller(cfg):
    """The KL-to-reference coefficient: adaptive (Ziegler et al. 2019, toward ``kl_target``) or fixed at ``beta``."""
    if cfg.kl_control == "adaptive":
        return AdaptiveKLController(cfg.beta, cfg.kl_target, cfg.kl_horizon)
    return FixedKLController(cfg.beta)


def restore(tr, ckpt) -> None:
    """A resumed run's KL controller, alarms and collapse guard (with the guard's snapshot of weights + optimizer)."""
    tr.kl_ctl = kl_controller_from_state(ckpt.state["kl_controller"])
    tr.alarms.load_state_dict(ckpt.state["alarms"])
    if ckpt.state.get("collapse"):
        tr.collapse.load_state_dict(ckpt.state["collapse"])
        tr.snapshot = load_snapshot(ckpt.path)
