"""The DPO family's model and inputs, as ``open_training`` asks for them (``trainers/engine/setup.py``):
:class:`DPOInputs` builds the policy (the resumed one, or a copy of the start; with LoRA the start itself, its base
then the reference), reads and checks the user's file and the evaluation set before the run directory is written
(``inputs``), then, in the run directory, samples the embedded task's on-policy pairs (cached in ``pairs.jsonl``) and
computes the frozen reference's log-probs once (``run_inputs``).

Held-out pairs, scored by the run's own loss (``trainers/preference_eval.py``): ``--eval-data`` of pairs, or without
it the slice of ``--data`` held out from training (``tasks/base.py``); the generation accuracy is measured on their
prompts with the preferred answer (the embedded task: its held-out problems).

Not handled here: the batches and the loss's inputs (``trainers/preference_data.py``), the step (``dpo.py``).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from posttrain.chat import chat_tokenizer, resolve_chat
from posttrain.data.checks import model_window
from posttrain.data.preference import fit_kto, fit_pairs, load_preference_pairs, pairs_to_kto
from posttrain.data.preference_pairs import PAIRS_FILE, PairDataConfig, cached_pairs, stats_dict
from posttrain.errors import ConfigError
from posttrain.evaluation import fit_prompts
from posttrain.models.lora import apply_lora, lora_config, reference_model
from posttrain.on_policy_pairs import on_policy_pairs
from posttrain.tasks.arithmetic import ArithmeticTask
from posttrain.trainers import common, distributed
from posttrain.trainers.preference_data import PairedData, UnpairedData, load_user_data
from posttrain.trainers.preference_eval import PairEval, is_pairs_file


@dataclass
class PreferenceRun:
    """What a DPO-family run trains and evaluates on."""

    data: PairedData | UnpairedData
    pair_info: dict  # how the embedded task's pairs were sampled ({} for --data)
    ref_model: torch.nn.Module | None  # None: reference-free, or paired with precomputed log-probs
    ref_table: torch.Tensor | None  # (N, 2) or (N, 1) precomputed reference log-probs
    pair_eval: PairEval | None  # held-out pairs: eval_loss, eval_rewards/*
    evals: list  # held-out (prompt, answer) problems, checked for generation


class DPOInputs:
    """``build`` / ``inputs`` / ``run_inputs`` of one run (``choice``: its resolved loss)."""

    def __init__(self, cfg, task, choice):
        self.cfg, self.task, self.choice, self.chat = cfg, task, choice, None

    def build(self, start):
        """The resumed policy, or the start's copy (with LoRA: the start itself, its base = the reference)."""
        cfg = self.cfg
        self.chat = resolve_chat(cfg.chat_template, start.init.tokenizer, [start.init.path])
        tokenizer = chat_tokenizer(start.init.tokenizer, self.chat)  # with a template, EOS is its end-of-turn token
        if start.ckpt is not None:
            return start.ckpt.model, tokenizer
        policy = apply_lora(start.init.model, lora_config(cfg)) if cfg.lora_r else copy.deepcopy(start.init.model)
        return policy, tokenizer

    def _fit(self, examples, tokenizer, model, paired: bool):  # encode once, check characters and lengths (--long)
        cfg = self.cfg
        return (fit_pairs if paired else fit_kto)(
            examples,
            tokenizer,
            window=model_window(model),
            long=cfg.long,
            max_prompt_length=cfg.max_prompt_length,
            max_completion_length=cfg.max_completion_length,
        )

    def inputs(self, t):
        """The user's file (less its held-out slice) and the evaluation set, checked before anything is written."""
        cfg, choice, world, tokenizer, init = self.cfg, self.choice, t.world, t.tokenizer, t.init
        if world.distributed and choice.batch_coupled:
            raise ConfigError(
                f"loss={cfg.loss!r} couples the examples of a batch (batch statistics, sorting or a shared "
                f"state): split over {world.world_size} processes it would change; run it in one process"
            )
        if world.distributed and cfg.batch_size < world.world_size:
            raise ConfigError(f"batch_size={cfg.batch_size} must be >= the number of processes ({world.world_size})")
        examples = None
        if cfg.data:
            user = load_user_data(cfg.data, choice.unpaired, self.chat, cfg.on_bad_line)
            examples = self._fit(user, tokenizer, init.model, paired=not choice.unpaired)
        held_pairs = None  # held-out (prompt, chosen, rejected): TRL's eval metrics (paired losses)
        if examples is not None:  # no --eval-data: a held-out slice of --data is not trained on (tasks/base.py)
            keep = self.task.hold_out(examples, key=lambda x: x.prompt, as_problem=_problem)
            if len(keep) < len(examples):
                kept = set(keep)
                held_pairs = [examples[i] for i in range(len(examples)) if i not in kept]
                examples = examples.subset(keep) if hasattr(examples, "subset") else [examples[i] for i in keep]
        if cfg.eval_data and is_pairs_file(cfg.eval_data):  # --eval-data of pairs: scored by the loss, and generation
            pairs = load_preference_pairs(cfg.eval_data, chat=self.chat, on_bad_line=cfg.on_bad_line)
            held_pairs = self._fit(pairs, tokenizer, init.model, paired=True)
            evals = [(p.prompt, p.chosen) for p in held_pairs]  # generation: the preferred answer, exact match
        else:
            evals = self.task.eval_set(self.chat)  # --eval-data, the slice as (prompt, chosen), or the task's problems
        evals = fit_prompts(tokenizer, evals, model=init.model, max_new_tokens=cfg.max_new_tokens, long=cfg.long)
        if self.task.note:
            print(self.task.note)
        return examples, held_pairs, evals

    def run_inputs(self, t) -> PreferenceRun:
        """On-policy pairs sampled from the start (cached in the run directory); the reference's log-probs."""
        cfg, choice, unpaired = self.cfg, self.choice, self.choice.unpaired
        (examples, held_pairs, evals), init, tokenizer, pair_info = t.inputs, t.init, t.tokenizer, {}
        if examples is None:
            meta = {
                "init": str(Path(cfg.init or cfg.model_path).resolve()),
                "pairs": dataclasses.asdict(cfg.pairs),
                "task": dataclasses.asdict(cfg.task),
            }
            print(f"sampling preference pairs from {cfg.init or cfg.model_path} ...")
            with distributed.main_first(t.world):  # rank 0 samples and caches them; the others read the cache
                pairs, pair_info = cached_pairs(
                    Path(t.run.dir) / PAIRS_FILE, meta, lambda: _build_pairs(init, self.task, cfg.pairs)
                )
            examples = self._fit(pairs_to_kto(pairs) if unpaired else pairs, tokenizer, init.model, not unpaired)
        data = (UnpairedData if unpaired else PairedData)(examples, tokenizer, cfg)
        ref_model = None if choice.reference_free else reference_model(t.model, lambda: common.frozen(init.model))
        ref_table = None
        pair_eval = PairEval(PairedData(held_pairs, tokenizer, cfg)) if held_pairs and not unpaired else None
        if ref_model is not None and cfg.precompute_ref:
            t0 = time.perf_counter()
            ref_table = data.precompute(ref_model)  # (N, 2) or (N, 1)
            if pair_eval is not None:
                pair_eval.ref_table = pair_eval.data.precompute(ref_model)  # (M, 2)
            print(f"reference log-probs precomputed for {len(examples)} examples in {time.perf_counter() - t0:.1f}s")
            if not unpaired:
                ref_model = None  # no longer needed: one forward pass per step
        return PreferenceRun(data, pair_info, ref_model, ref_table, pair_eval, evals)


def _problem(x) -> tuple[str, str] | None:
    """A held-out pair (or KTO example) as a generation problem: its prompt and the preferred answer (an
    undesirable KTO completion is none)."""
    if hasattr(x, "chosen"):
        return x.prompt, x.chosen
    return (x.prompt, x.completion) if x.label else None


def _build_pairs(init, task: ArithmeticTask, pcfg: PairDataConfig):
    pairs, stats = on_policy_pairs(init.model, init.tokenizer, task.rl_prompts(), pcfg)
    info = stats_dict(stats)
    print(
        f"  {info['pairs']} pairs from {info['prompts_with_pairs']}/{info['prompts']} prompts "
        f"(sample accuracy {info['sample_accuracy']:.3f})"
    )
    return pairs, info
