"""The reward model's model and pairs, as ``open_training`` asks for them (``trainers/engine/setup.py``):
``build_reward_model`` (the resumed RM, a scalar head on the ``--init`` / ``--model`` start, or a fresh GPT with a
head; LoRA adapters on the backbone when asked), ``user_pairs`` (``--data`` / ``--eval-data``, read and checked before
the run directory is written) and ``run_pairs`` (the embedded task's pairs, built and cached in the run directory,
then every pair fitted to the model's window).

The embedded task's pairs: on-policy samples of ``--init`` labelled by the verifier (chosen correct, rejected wrong;
``--train-pairs.*`` shapes the training pairs, e.g. with samples of the other SFT restarts), or, with no model to
sample, the reference answer against corrupted answers (``synthetic_pairs``). Held-out pairs come from the task's
held-out split the same way (never a training prompt; ``--train-pairs.*`` never touches them); on ``--data`` they
are its held-out slice (``tasks/base.py``) or ``--eval-data``.

Not handled here: the batches (``trainers/reward_batches.py``) and the loss (``trainers/reward.py``).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path

from posttrain.chat import chat_tokenizer, resolve_chat
from posttrain.checkpoints.load import load_policy
from posttrain.data.checks import model_window
from posttrain.data.preference import fit_pairs, load_preference_pairs
from posttrain.data.preference_pairs import cached_pairs, stats_dict, synthetic_pairs
from posttrain.errors import ConfigError, UserError
from posttrain.models.gpt import GPT
from posttrain.models.heads import RewardModel
from posttrain.models.lora import apply_lora, lora_config
from posttrain.on_policy_pairs import TrainPairsConfig, on_policy_pairs, restart_models, training_pairs
from posttrain.rewards.reward_model import load_reward_model
from posttrain.tasks.arithmetic import ArithmeticTask
from posttrain.tasks.base import heldout_note, heldout_split
from posttrain.tasks.files import fresh_tokenizer
from posttrain.trainers import distributed, sharded
from posttrain.trainers.reward_batches import has_lm_head


@dataclass
class RewardPairs:
    train: list  # fitted training pairs
    held: list  # fitted held-out pairs
    pair_info: dict  # how the embedded task's pairs were built ({} for --data)


def build_reward_model(cfg, task, start):
    """(reward model, tokenizer): the resumed RM, a head on the start (pairs are sampled from it first), or a fresh
    GPT with a head (its tokenizer ``task``'s: tasks/files.py::fresh_tokenizer, bytes on --data); lora_r > 0: adapters on the frozen backbone, the head trains."""
    if start.ckpt is not None and sharded.is_sharded_checkpoint(start.ckpt.path):  # weights come with the optimizer
        rm, tokenizer = RewardModel(start.ckpt.model), start.ckpt.tokenizer
    elif start.ckpt is not None:
        loaded = load_reward_model(start.ckpt.path)
        rm, tokenizer = loaded.model, loaded.tokenizer
    elif start.init is not None:
        rm, tokenizer = RewardModel(start.init.model), start.init.tokenizer
    else:
        tokenizer = fresh_tokenizer(task)  # --data: bytes; the embedded task: its characters
        rm = RewardModel(GPT(dataclasses.replace(cfg.model, vocab_size=tokenizer.vocab_size)))
    apply_lora(rm.backbone.model, lora_config(cfg))
    return rm, tokenizer


def user_pairs(cfg, t):
    """(training, held-out) pairs of ``--data`` (and ``--eval-data``), or None for the embedded task's; ``t.tokenizer``
    becomes the chat tokenizer when a template applies."""
    if t.world.distributed and cfg.batch_size < t.world.world_size:
        raise ConfigError(f"batch_size={cfg.batch_size} must be >= the number of processes ({t.world.world_size})")
    if cfg.sft_coef > 0 and (t.world.distributed or not has_lm_head(t.model)):
        raise UserError(
            "--sft-coef needs a language-model backbone (posttrain's GPT or a Hugging Face causal LM, not an "
            "encoder) on one process: the NLL comes from the backbone's own LM head; pass --sft-coef 0 to train "
            "without it"
        )
    if not cfg.data:
        if cfg.eval_data:
            raise UserError("--eval-data needs --data (the training pairs), or neither for the embedded task")
        return None
    chat = resolve_chat(cfg.chat_template, t.tokenizer, [getattr(t.init, "path", None)])
    t.tokenizer = chat_tokenizer(t.tokenizer, chat)  # with a template, EOS is its end-of-turn token
    train = load_preference_pairs(cfg.data, chat=chat, on_bad_line=cfg.on_bad_line)
    if cfg.eval_data:
        return train, load_preference_pairs(cfg.eval_data, chat=chat, on_bad_line=cfg.on_bad_line)
    keep, held = heldout_split([p.prompt for p in train])  # the one rule (tasks/base.py): a slice of --data
    print(heldout_note(len(held), len(train), cfg.data, "held-out pairwise accuracy"))
    return [train[i] for i in keep], [train[i] for i in held]


def run_pairs(cfg, task, t) -> RewardPairs:
    """The user's pairs (``t.inputs``) or the embedded task's (sampled and cached in the run directory; rank 0
    builds them, the others read the cache), fitted to the model's window."""
    if t.inputs is not None:
        (train, held), pair_info = t.inputs, {}
    else:
        with distributed.main_first(t.world):
            train, held, pair_info = embedded_pairs(cfg, task, t.init, Path(t.run.dir))
    fit = dict(window=model_window(t.model), long=cfg.long, max_prompt_length=cfg.max_prompt_length)
    fit["max_completion_length"] = cfg.max_completion_length
    train, held = (fit_pairs(x, t.tokenizer, what=what, **fit) for x, what in ((train, "training"), (held, "held-out")))
    return RewardPairs(train, held, pair_info)


def embedded_pairs(cfg, task: ArithmeticTask, init, out: Path):
    """(training pairs, held-out pairs, {"train": info, "heldout": info}) of the embedded task, cached in ``out``
    (``pairs.jsonl``, ``eval_pairs.jsonl``)."""
    source = cfg.source if cfg.source != "auto" else ("policy" if init is not None else "synthetic")
    if source == "policy" and init is None:
        raise UserError("--source policy samples the --init model: pass --init SFT_CHECKPOINT")
    rng_problems = random.Random(f"rm-prompts:{cfg.pairs.seed}")
    train_p = rng_problems.sample(task.train_problems, min(cfg.pairs.num_prompts, len(task.train_problems)))
    held_p = rng_problems.sample(task.heldout_problems, min(cfg.eval_prompts, len(task.heldout_problems)))
    meta = {
        "source": source,
        "init": str(Path(cfg.init).resolve()) if cfg.init else None,
        "pairs": dataclasses.asdict(cfg.pairs),
        "task": dataclasses.asdict(cfg.task),
        "eval_prompts": cfg.eval_prompts,
    }

    def build(problems):
        if source == "synthetic":
            pairs = synthetic_pairs(problems, per_prompt=cfg.pairs.max_pairs_per_prompt, seed=cfg.pairs.seed)
            return pairs, {"source": "synthetic", "prompts": len(problems), "pairs": len(pairs)}
        pairs, st = on_policy_pairs(init.model, init.tokenizer, problems, cfg.pairs, num_prompts=len(problems))
        return pairs, {"source": "policy", **stats_dict(st)}

    plain = source == "synthetic" or cfg.train_pairs == TrainPairsConfig()  # the pairs of before --train-pairs
    if source == "synthetic" and cfg.train_pairs_requested():
        raise UserError("--train-pairs.* shapes on-policy training pairs: pass --init SFT_CHECKPOINT (--source policy)")

    def build_train():  # the held-out pairs never see --train-pairs.* (the test stays the same)
        if plain:
            return build(train_p)
        mode = cfg.train_pairs.restarts
        paths = restart_models(cfg.init, mode == "on", cfg.train_pairs.max_restarts) if mode != "off" else []
        others = [(str(p), *_load_other(p)) for p in paths]
        return training_pairs(init.model, init.tokenizer, train_p, cfg.pairs, cfg.train_pairs, others)

    print(f"building {source} preference pairs ...")
    train_meta = meta if plain else {**meta, "train_pairs": dataclasses.asdict(cfg.train_pairs)}
    train, info = cached_pairs(out / "pairs.jsonl", train_meta, build_train)
    held, held_info = cached_pairs(out / "eval_pairs.jsonl", meta, lambda: build(held_p))
    return train, held, {"train": info, "heldout": held_info}


def _load_other(path):
    ck = load_policy(path, role="rm --train-pairs.restarts")
    return ck.model, ck.tokenizer
