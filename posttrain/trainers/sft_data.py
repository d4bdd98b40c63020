"""SFT's model and inputs, as ``open_training`` asks for them (``trainers/engine/setup.py``): ``build_model`` (the
resumed checkpoint, the ``--init`` / ``--model`` start, or a fresh GPT of ``cfg.model``, with LoRA adapters when
asked) and ``sft_inputs`` (the demonstrations, validation and evaluation problems, encoded and checked against the
model's window before the run directory is written: a bad record is a one-line error with nothing written).

The splits: without ``--eval-data`` a held-out slice of ``--data`` is not trained on (``tasks/base.py``); its
demonstrations give ``eval_loss`` (``trainers/sft_eval.py``), as does an ``--eval-data`` of conversations. Model
selection (``val_fraction > 0``) validates on the embedded task's *dev* split (``val_problems`` of it, or
``--val-data``'s problems), every demonstration training; on ``--data`` on ``val_fraction`` of the training
demonstrations, chosen by a stable hash of the prompt (``trainers/selection.py``). The held-out (test) split is never
a validation problem.

Not handled here: the batches (``data/batches.py``) and the loss (``trainers/sft.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from posttrain.chat import chat_tokenizer, resolve_chat
from posttrain.data.conversations import load_sft_data
from posttrain.data.demos import fit_demos
from posttrain.errors import ConfigError
from posttrain.evaluation import fit_prompts
from posttrain.models import digit_slots
from posttrain.models.gpt import GPT
from posttrain.models.lora import apply_lora, lora_config
from posttrain.tasks.files import fresh_tokenizer
from posttrain.tokenizers import load as load_tokenizer
from posttrain.trainers import sft_restarts
from posttrain.trainers.selection import split_validation
from posttrain.trainers.sft_eval import is_demos_file


@dataclass
class SFTInputs:
    demos: list  # the demonstrations kept for training (after the held-out slice), fitted
    ids: torch.Tensor  # (n_train, L) the training demonstrations (those not validating), encoded
    loss_mask: torch.Tensor  # (n_train, L) 1 on completion tokens
    vals: list  # validation (prompt, answer) problems: model selection
    evals: list  # held-out (prompt, answer) problems, checked for generation
    held: tuple | None  # (ids, loss mask) of held-out demonstrations: eval_loss


def build_model(cfg, task, start):
    """(model, tokenizer): the resumed checkpoint's, the start's, or a fresh GPT (lora_r > 0: adapters on a frozen
    base); a fresh model without --tokenizer gets ``task``'s (tasks/files.py::fresh_tokenizer: bytes on --data)."""
    if start.ckpt is not None or start.init is not None:
        model, tokenizer = (start.ckpt or start.init).model, (start.ckpt or start.init).tokenizer
    else:
        tokenizer = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else fresh_tokenizer(task)
        digit_slots.check_tokenizer(tokenizer, cfg.model.digit_slots, cfg.task.digits)  # with model.digit_slots
        model = GPT(dataclasses.replace(cfg.model, vocab_size=tokenizer.vocab_size))
    return apply_lora(model, lora_config(cfg)), tokenizer


def sft_inputs(cfg, task, demos, t) -> SFTInputs:
    """``demos`` (the task's) and its evaluation set, encoded for ``t``'s model; ``t.tokenizer`` becomes the chat
    tokenizer when a template applies (EOS = its end-of-turn token)."""
    chat = resolve_chat(cfg.chat_template, t.tokenizer, [getattr(x, "path", None) for x in (t.ckpt, t.init)])
    t.tokenizer = chat_tokenizer(t.tokenizer, chat)
    fitted, ids, loss_mask = fit_demos(t.tokenizer, demos, t.model, cfg.long, chat)
    keep = task.hold_out(fitted)  # no --eval-data: a held-out slice of --data is not trained on (tasks/base.py)
    held = None
    if len(keep) < len(fitted):
        out_idx = sorted(set(range(len(fitted))) - set(keep))
        held = (ids[out_idx], loss_mask[out_idx])
        fitted, ids, loss_mask = [fitted[i] for i in keep], ids[keep], loss_mask[keep]
    if getattr(cfg, "eval_data", None) and is_demos_file(cfg.eval_data):  # conversations: loss + generation
        e_demos = load_sft_data(cfg.eval_data, "evaluation", on_bad_line=cfg.on_bad_line)
        e_fitted, e_ids, e_mask = fit_demos(t.tokenizer, e_demos, t.model, cfg.long, chat)
        held, evals = (e_ids, e_mask), list(e_fitted)  # generation: each one's prompt and last reply
    else:
        evals = task.eval_set(chat)  # --eval-data, that slice, or the embedded task's held-out problems
    if cfg.val_fraction > 0 and not cfg.data:  # the embedded task: choose on its dev split, train on every demo
        train_idx, vals = list(range(len(fitted))), sft_restarts.validation_problems(cfg)
    else:
        train_idx, val_idx = split_validation(fitted, cfg.val_fraction)
        vals = [fitted[i] for i in val_idx]
    evals = fit_prompts(t.tokenizer, evals, model=t.model, max_new_tokens=cfg.max_new_tokens, long=cfg.long)
    if t.world.distributed and cfg.batch_size < t.world.world_size * cfg.grad_accum:
        raise ConfigError(
            f"batch_size={cfg.batch_size} must be >= processes x grad_accum = {t.world.world_size} x {cfg.grad_accum}"
        )
    return SFTInputs(fitted, ids[train_idx], loss_mask[train_idx], vals, evals, held)
