"""Policy-gradient RL with verifiable rewards: REINFORCE, RLOO and GRPO in one thin loop.

Key insight: grad J = E[grad log pi(y|x) * A]; the algorithms differ only in the advantage A (the
baseline), so one loop serves all three and every KL / clip / aggregation option applies to each:

    for each step:
        prompts x G samples  ~ pi_old (KV-cache sampler; log-probs of the *sampling* distribution kept)
        r = reward(prompt, completion)                      (optionally r - beta * KL folded in)
        A = ADVANTAGE_ESTIMATORS[algo](r, G)                (reinforce | rloo | grpo)
        mu epochs x minibatches:  L = policy_loss(logpi, logpi_old, A, mask, clip, KL-in-loss, entropy, agg)

pi_old stays fixed at sampling time for all mu updates. With beta = 0 no reference model is built.

``dynamic_sampling`` (DAPO): groups whose G rewards are all equal are dropped and further prompt batches
are drawn (at most ``max_sample_rounds`` per step) until ``prompts_per_step`` groups with signal are kept
(``trainers/dynamic_sampling.py``); the logged reward/accuracy are those of the step's first, unfiltered
batch, ``groups_drawn``/``groups_kept`` say what was filtered. A step with no informative group makes no
update. Reward collapse (``alarms.CollapseGuard``): the smoothed reward falling below a fraction of its best
for ``collapse_patience`` steps restores the weights and optimizer snapshotted at that best, with the LR
scaled down (bounded number of restores; logged as ``restores`` / ``restored_from``).

The rollout (sampling, rewards, dynamic sampling, advantages) is :mod:`posttrain.trainers.pg_rollout`.

``--fsdp`` (under torchrun) shards the policy (FSDP2, ``trainers/sharded.py``: sharded checkpoints, resumable at
another world size); the frozen reference stays whole on each rank; rollouts and evaluation sample from a replica
of the policy refreshed once per step; every rank runs ``grad_accum`` micro-batches per minibatch. Not handled
with it: LoRA, the collapse guard's snapshot in a sharded checkpoint (kept in memory), the shared-prefix forward.

Shape (every trainer's, ``trainers/engine/protocol.py``), as methods of :class:`PolicyGradientTrainer`, whose state
lives on the instance: ``__init__`` is the set-up (through the one ``open_training``), ``train_step(step)`` (=
``rollout`` + ``update`` + KL controller, alarms, collapse guard), ``evaluate``, ``save``, ``finish``; ``train()``
hands it to the one loop (``trainers/engine/run.py``).

Everything random is a pure function of (seed, step) — the prompt batch, the sampling generator (of each
dynamic-sampling round), the minibatch order — so a resumed run reproduces an uninterrupted one exactly
(with the model, optimizer, KL-controller, alarm and collapse-guard state, and the guard's snapshot,
restored from the checkpoint).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from pathlib import Path

import torch

from posttrain.chat import chat_tokenizer, resolve_chat
from posttrain.errors import ConfigError, UserError
from posttrain.losses.kl import kl_controller_from_state
from posttrain.losses.policy import batch_normalizers, merge_metrics, policy_loss
from posttrain.losses.policy_objectives import OBJECTIVE_OPTIONS
from posttrain.models.gpt import GPT
from posttrain.models.lora import apply_lora, lora_config, merge_lora, reference_model
from posttrain.rewards.registry import build_reward
from posttrain.scoring import completion_logps, prefix_shared_completion_logps
from posttrain.tasks.files import task_for
from posttrain.trainers import common, distributed, engine_rollout, pg_rollout, sharded
from posttrain.trainers.alarms import Alarms, CollapseGuard, watch_step
from posttrain.trainers.checkpoint import initial_model, load_snapshot, rng_state, write_snapshot
from posttrain.trainers.engine import device
from posttrain.trainers.engine.publish import publish_model
from posttrain.trainers.engine.run import run as engine_run
from posttrain.trainers.engine.setup import open_training
from posttrain.trainers.guards import finite_step
from posttrain.trainers.pg_config import PRESETS, PolicyGradientConfig  # noqa: F401  (the trainer registry reads them here)
from posttrain.trainers.pg_rollout import Rollout, step_generator
from posttrain.trainers.prompt_filter import PromptHistory
from posttrain.trainers.rl import common as rl
from posttrain.trainers.rl.common import kl_controller, rl_inputs
from posttrain.trainers.weight_average import TailAverage


class PolicyGradientTrainer:
    """Thin loop: rollout -> score -> advantages -> clipped updates. State for exact resume lives here;
    ``__init__`` is the trainer's set-up (the run directory is written only once its inputs are checked)."""

    def __init__(self, cfg: PolicyGradientConfig, resume: str | None = None, overwrite: bool = False):
        if not (cfg.init or cfg.model_path) and not resume:
            raise UserError(
                "RL needs a starting policy: pass --init SFT_CHECKPOINT (e.g. the out dir of "
                "`posttrain sft`) or --model DIR"
            )
        self.cfg, self.name = cfg, cfg.algo
        self.task = task_for(cfg, "prompts")  # --data (FileTask) or the embedded task: tasks/files.py
        self.reward_fn = build_reward(cfg.reward, rm_path=cfg.reward_model, answer_field=cfg.answer_field)
        t = open_training(
            cfg,
            "policy_gradient",
            resume,
            overwrite,
            build=self._build,
            inputs=self._inputs,
            run_inputs=self._reference,
            keep_init=True,
            command="grpo",
        )
        self.run, self.out, self.world, self.start_step = t.run, t.run.dir, t.world, t.start_step
        self.model, self.tokenizer, self.opt, self.logger, self.manager = (
            t.model,
            t.tokenizer,
            t.opt,
            t.logger,
            t.manager,
        )
        ckpt = t.ckpt
        self.model.train()
        self.kl_ctl = kl_controller(cfg)
        self.alarms = Alarms(cfg.alarms, cfg.nan_patience)
        self.guard = rl.AlarmsGuard(self)  # the loop's one non-finite guard (trainers/engine/run.py)
        self.collapse, self.snapshot = CollapseGuard(cfg.alarms), None  # snapshot: weights + optimizer at the best
        if ckpt is not None:
            self.kl_ctl = kl_controller_from_state(ckpt.state["kl_controller"])
            self.alarms.load_state_dict(ckpt.state["alarms"])
            if self.prompt_history is not None and ckpt.state.get("prompt_history"):
                self.prompt_history.load_state_dict(ckpt.state["prompt_history"])
            if ckpt.state.get("collapse"):
                self.collapse.load_state_dict(ckpt.state["collapse"])
                self.snapshot = load_snapshot(ckpt.path)
        self.tail = TailAverage(cfg.steps, cfg.average_last, cfg.average_every)  # the final model's weight average
        if ckpt is not None:
            self.tail.load(ckpt.path, ckpt.state.get("weight_average"), self.model)
        self.last_eval, self.initial = None, None

    def _build(self, start):
        """The policy: the resumed checkpoint's, or the --init / --model start (LoRA adapters on it when asked)."""
        src = start.ckpt or start.init
        model, tokenizer = apply_lora(src.model, lora_config(self.cfg)), src.tokenizer
        self.chat = resolve_chat(
            self.cfg.chat_template, tokenizer, [getattr(x, "path", None) for x in (start.ckpt, start.init)]
        )
        return model, chat_tokenizer(tokenizer, self.chat)  # with a template, EOS is its end-of-turn token

    def _reference(self, t) -> None:
        """The reference is the *initial* policy (from --init, or the resumed run's own init), made before the policy
        is placed or sharded: a frozen copy; with LoRA the policy itself with its adapters switched off."""
        self.ref_model = None
        if self.cfg.beta > 0:
            self.ref_model = reference_model(
                t.model, lambda: common.frozen(copy.deepcopy(initial_model(t.init, t.ckpt)))
            )

    def _inputs(self, t) -> None:
        """The prompts and evaluation set, the prompt filter and the rollout engine, checked before anything is
        written (under several processes: whole groups per rank)."""
        cfg, w = self.cfg, t.world
        if w.distributed:  # groups stay whole on one rank; batch-wide statistics would differ per rank
            if cfg.prompts_per_step % w.world_size:
                raise ConfigError(
                    f"prompts_per_step={cfg.prompts_per_step} must be divisible by the number of "
                    f"processes ({w.world_size}): each rank samples whole groups"
                )
            if (cfg.algo == "grpo" and cfg.scale_rewards == "batch") or (
                cfg.algo == "reinforce" and cfg.reinforce_baseline == "batch_mean"
            ):
                raise ConfigError(
                    "batch-wide advantage statistics (scale_rewards=batch, reinforce_baseline=batch_mean) "
                    "are per rank under several processes; use group statistics or one process"
                )
        ins = rl_inputs(cfg, self.task, self.reward_fn, self.chat, t)  # trainers/rl/common.py
        self.data, self.fsdp, self.replica, self.engine = ins.data, ins.fsdp, ins.replica, ins.engine
        self.prompts, self.evals = self.data.train, self.data.evals  # rows with .prompt (the text) and .answer
        self.prompt_history = None  # the prompt filter's: one process, refill rounds (dynamic sampling) only
        if cfg.prompt_filter and cfg.dynamic_sampling and not w.distributed:
            self.prompt_history = PromptHistory(len(self.prompts))
        elif cfg.prompt_filter and cfg.dynamic_sampling and w.is_main:
            print("prompt_filter: off under several processes (its prompt history is one process's)")

    # ------------------------------------------------------------------------------------------ rollout
    def rollout(self, step: int) -> Rollout:
        sharded.sync_replica(self.replica, self.model)  # FSDP: the current weights into the sampler, on every rank
        ro = engine_rollout.correct_rollout(self, pg_rollout.rollout(self, step))  # pi_old and TIS weights
        return device.to_device(ro)  # rewards and advantages (made on the CPU) beside the samples, on the run's device

    def annealed_terms(self, step: int):
        """What ``reward_anneal`` takes off the reward at ``step``: sum_k (1 - f) w_k r_k as a reward function
        over the annealed terms k (None when nothing is annealed yet)."""
        f = self.cfg.anneal_factor(step)
        if not self.cfg.anneal_names or f >= 1.0:
            return None
        return self.reward_fn.reweighted({k: (1.0 - f) * self.reward_fn.terms[k][1] for k in self.cfg.anneal_names})

    # ------------------------------------------------------------------------------------------ update
    def _micro_loss(self, ro: Rollout, rows: torch.Tensor, norms: dict):
        cfg = self.cfg
        mask = ro.completion_mask[rows]
        width = int(mask.sum(-1).max()) if mask.any() else 1  # trim completion padding shared by all rows
        P = ro.prompt_length
        seqs, attn = ro.sequences[rows, : P + width], ro.attention_mask[rows, : P + width]
        if cfg.share_prompt_prefix and isinstance(self.model, GPT) and not self.fsdp:
            logps, entropy = prefix_shared_completion_logps(
                self.model,
                seqs,
                attn,
                P,
                ro.prompt_index[rows],
                temperature=cfg.temperature,
                top_k=cfg.top_k,
                top_p=cfg.top_p,
                completion_mask=mask[:, :width],
            )
        else:
            logps, entropy = completion_logps(
                self.model,
                seqs,
                attn,
                P,
                temperature=cfg.temperature,
                top_k=cfg.top_k,
                top_p=cfg.top_p,
                completion_mask=mask[:, :width],
                return_entropy=True,
            )
        return policy_loss(
            logps,
            ro.old_logps[rows, :width],
            ro.advantages[rows],
            mask[:, :width],
            clip_eps_low=cfg.clip_eps_low,
            clip_eps_high=cfg.clip_eps_high,
            dual_clip=cfg.dual_clip,
            ratio_level=cfg.ratio_level,
            agg=cfg.loss_agg,
            entropy=entropy,
            entropy_coef=cfg.entropy_coef,
            ref_logps=ro.ref_logps[rows, :width] if ro.ref_logps is not None else None,
            beta=self.kl_ctl.value if cfg.kl_in == "loss" else 0.0,
            kl_estimator=cfg.kl_estimator,
            **norms,
            objective=cfg.objective,
            kl_bias_correction=cfg.kl_bias_correction,
            objective_kwargs={k: getattr(cfg, f"{cfg.objective}_{k}") for k in OBJECTIVE_OPTIONS[cfg.objective]},
            is_weights=ro.is_weights[rows, :width] if ro.is_weights is not None else None,
        )

    def update(self, ro: Rollout, step: int) -> dict:
        cfg, w = self.cfg, self.world
        N = ro.sequences.shape[0]
        apply = ro.apply if not w.distributed else distributed.global_sum(int(ro.apply), w) > 0  # one decision
        if not apply:  # dynamic sampling found no group with signal: measure only (no Adam momentum step)
            with torch.no_grad():
                _, met = self._micro_loss(
                    ro, torch.arange(N), batch_normalizers(ro.completion_mask, max_len=cfg.max_new_tokens)
                )
            return {**met, "grad_norm": 0.0, "skipped_updates": 0}
        if not ro.apply:  # another rank has signal: this one takes part with no rows (zero gradient)
            N = 0
        parts, gnorms, skipped = [], [], 0
        offset, total = distributed.row_offsets(N, w)  # this rank's rows are [offset, offset + N) of the global batch
        for epoch in range(cfg.mu):
            order = (
                torch.randperm(total, generator=step_generator(cfg.seed, step, salt=1 + epoch))
                if cfg.minibatches > 1
                else torch.arange(total)
            )
            # equal splits of the global batch (dynamic sampling keeps a varying number of rows: then as equal as
            # possible); each rank works on its own rows of each global minibatch, so the minibatches (and their
            # gradients) are those of one process, and every rank runs every split
            for split in (r for r in torch.tensor_split(order, cfg.minibatches) if len(r)):
                rows = split[(split >= offset) & (split < offset + N)] - offset
                norms = self._global_normalizers(ro.completion_mask[rows])
                mb_parts = []
                micros = (  # FSDP: grad_accum on every rank (each pass is a collective; a dummy has weight 0)
                    sharded.fixed_micro_batches(rows, cfg.grad_accum)
                    if self.fsdp
                    else [(m, False) for m in torch.tensor_split(rows, cfg.grad_accum) if len(m)]
                )
                for k, (micro, dummy) in enumerate(micros):
                    with sharded.no_sync(self.model, last=k == len(micros) - 1):
                        loss, met = self._micro_loss(ro, micro, norms)
                        if dummy or self.fsdp:  # FSDP averages over ranks: W x this rank's share sums to the total
                            loss = loss * (0.0 if dummy else distributed.ddp_loss_scale(w))
                        loss.backward()
                    if not dummy:
                        mb_parts.append(met)
                if not self.fsdp:  # (FSDP has reduced them)
                    distributed.all_reduce_grads(self.model, w)  # the global minibatch's gradient on every rank
                gnorm = common.grad_norm_and_clip(self.model, cfg.grad_clip)
                met = merge_metrics(mb_parts) if mb_parts else {"loss": 0.0, "pg_loss": 0.0}
                if w.distributed:  # the same skip decision on every rank: the global loss (a sum of the ranks')
                    met["loss"] = distributed.global_sum(met["loss"], w)
                if not finite_step(self.opt, met["loss"], gnorm):
                    skipped += 1  # a non-finite step is skipped and reported, never applied
                parts.append(met)
                gnorms.append(gnorm)
        out = merge_metrics(parts)
        out["loss"] = out["loss"] / len(parts)  # mean over optimizer steps
        out["pg_loss"] = out["pg_loss"] / len(parts)
        out["grad_norm"] = max(gnorms) if all(map(math.isfinite, gnorms)) else float("nan")
        out["skipped_updates"] = skipped
        return out

    def _global_normalizers(self, mask: torch.Tensor) -> dict:
        """The minibatch's loss normalisers (sequences, tokens) over all ranks: each rank's rows are one part of it."""
        norms = batch_normalizers(mask, max_len=self.cfg.max_new_tokens)
        if self.world.distributed:
            norms["num_seqs"] = int(distributed.global_sum(int(mask.shape[0]), self.world))
            norms["num_tokens"] = max(distributed.global_sum(float(mask.sum().item()), self.world), 1.0)
        return norms

    # ------------------------------------------------------------------------------------------ the shape
    # setup (__init__) -> train_step / run_eval / save -> finish, as in every trainer (trainers/common.py)
    def train_step(self, step: int) -> dict:
        """One rollout batch and its updates, then the KL controller, the alarms and the collapse guard."""
        cfg, t0 = self.cfg, time.perf_counter()
        common.set_lr(
            self.opt, self.collapse.lr_scale * common.lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
        )
        ro = self.rollout(step)
        t1 = time.perf_counter()
        upd = self.update(ro, step)
        metrics = {
            **ro.metrics,
            **upd,
            "time_update": time.perf_counter() - t1,
            "step_time": time.perf_counter() - t0,
            "beta": self.kl_ctl.value,
        }
        # under torchrun: rank means, so that the KL controller, the alarms and the collapse guard decide alike
        metrics = distributed.mean_metrics(metrics, self.world)
        if "kl" in upd:
            self.kl_ctl.update(upd["kl"], 1)
        self.snapshot = watch_step(
            step + 1,
            metrics,
            self.alarms,
            self.collapse,
            self.model,
            self.opt,
            self.snapshot,
            reward=metrics["reward_mean"],
        )
        self.tail.add(self.model, step + 1)  # the weights after this step, for the final model's average
        return metrics

    # the rest of the engine's Trainer shape: evaluate, progress, early_stop (save and finish below)
    def evaluate(self, done: int, metrics: dict) -> None:
        rl.evaluate(self, done, metrics)

    def progress(self, metrics: dict) -> dict:
        return rl.progress(self, metrics)

    def early_stop(self, done: int) -> None:
        return None  # a non-finite streak is the guard's (the alarms: rl.AlarmsGuard)

    def run_eval(self):
        return rl.heldout_eval(self.model, self.replica, self.data, self.tokenizer, self.cfg.max_new_tokens)

    def _state(self, step: int, extra: dict | None = None) -> dict:
        return {
            "step": step,
            "trainer": "policy_gradient",
            "run_id": self.run.run_id,
            "config": dataclasses.asdict(self.cfg),
            "kl_controller": self.kl_ctl.state_dict(),
            "alarms": self.alarms.state_dict(),
            "weight_average": self.tail.state(),
            "prompt_history": self.prompt_history.state_dict() if self.prompt_history is not None else None,
            **(extra or {}),
        }

    def save(self, done: int, metrics: dict) -> None:
        """A periodic checkpoint (with the collapse guard's state and snapshot, for an exact resume); rank 0 writes;
        under --fsdp every rank its shards (without the snapshot)."""
        rl.save_periodic(self, done, tensors=self.tail.sharded_tensors() if self.fsdp else None)

    def _extras(self, tmp: Path) -> None:
        """In a periodic checkpoint: the collapse guard's snapshot and the weight average's running sum."""
        write_snapshot(tmp, self.snapshot)
        self.tail.write(tmp)

    def finish(self, stopped_at: int | None, t_start: float) -> dict:
        """``model/`` (unless the run stopped on non-finite updates; the tail average of the weights when asked),
        ``summary.json``; a stopped run then fails."""
        cfg, last_eval, initial = self.cfg, self.last_eval, self.initial
        stopped, final_step = stopped_at is not None, stopped_at or cfg.steps
        if last_eval is None:
            last_eval = self.run_eval()
        final, last_weights = None, None
        if not stopped and self.tail.apply(self.model):  # the mean of the weights at self.tail.added
            last_weights, last_eval = last_eval, self.run_eval()
            print(f"final model: the mean of the weights at steps {', '.join(map(str, self.tail.added))}")
        if not stopped:
            if cfg.merge_lora:  # model/ with full weights, no adapter files
                self.model = merge_lora(self.model)
            state = self._state(final_step, {"heldout_accuracy": last_eval.accuracy})
            final = publish_model(self.out, self.model, self.tokenizer, state, self.opt, self.world, rng_state())
        summary = {
            "trainer": cfg.algo,
            "steps": final_step,
            "stopped_early": stopped,
            "heldout_accuracy": last_eval.accuracy,
            "heldout_accuracy_start": initial.accuracy if initial else None,
            "heldout_n": last_eval.n,
            "heldout_accuracy_last_weights": (last_weights or last_eval).accuracy,  # before averaging
            "weight_average_steps": self.tail.added if last_weights else [final_step],  # the final model's steps
            "train_seconds": time.perf_counter() - t_start,
            "alarms": self.alarms.summary(),
            "restores": self.collapse.restores,
            "model_dir": str(final) if final else None,
            "samples": last_eval.samples,
        }
        return rl.close_run(self, summary, stopped_at, final, last_eval)

    def train(self) -> dict:
        """The held-out accuracy at the start (a fresh run), then the one loop (trainers/engine/run.py)."""
        cfg = self.cfg
        print(
            f"{cfg.algo.upper()}: {len(self.prompts)} training prompts, {cfg.prompts_per_step} x {cfg.num_generations} "
            f"samples/step, model {common.n_params(self.model) / 1e6:.2f}M params, reference model: "
            f"{'yes' if self.ref_model is not None else 'none (beta=0)'}, steps {self.start_step}->{cfg.steps}"
        )
        rl.start_eval(self)  # a fresh run's held-out accuracy, logged at step 0
        return engine_run(self)


def train_policy_gradient(cfg: PolicyGradientConfig, resume: str | None = None, overwrite: bool = False) -> dict:
    return PolicyGradientTrainer(cfg, resume=resume, overwrite=overwrite).train()
