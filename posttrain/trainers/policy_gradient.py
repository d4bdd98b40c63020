"""Policy-gradient RL with verifiable rewards: REINFORCE, RLOO and GRPO in one thin loop.

Key insight: grad J = E[grad log pi(y|x) * A]; the algorithms differ only in the advantage A (the
baseline), so one loop serves all three and every KL / clip / aggregation option applies to each:

    for each step:
        prompts x G samples ~ pi_old, r = reward(prompt, completion)      (rl/rollout.py: a function of values)
        A = ADVANTAGE_ESTIMATORS[algo](r, G)   (r - beta * KL folded in with kl_in=reward)        (rl/group.py)
        mu epochs x minibatches:  L = policy_loss(logpi, logpi_old, A, mask, clip, KL-in-loss, entropy, agg)

pi_old stays fixed at sampling time for all mu updates. With beta = 0 no reference model is built. Dynamic
sampling (DAPO) and the prompt filter (GRESO) are parts of the rollout (``rl/dynamic_sampling.py``,
``rl/prompt_filter.py``): a step with no informative group makes no update. Reward collapse
(``alarms.CollapseGuard``): the smoothed reward falling below a fraction of its best for ``collapse_patience``
steps restores the weights and optimizer snapshotted at that best, with the LR scaled down (logged as ``restores``).

``--fsdp`` (under torchrun) shards the policy (FSDP2, ``trainers/sharded.py``); the frozen reference stays whole on
each rank; rollouts and evaluation sample from a replica refreshed once per step. Not handled with it: LoRA, the
collapse guard's snapshot in a sharded checkpoint (kept in memory), the shared-prefix forward.

Shape (every trainer's, ``trainers/engine/protocol.py``): ``__init__`` is the set-up (through the one
``open_training``), ``train_step(step)`` (= ``rollout`` + ``update`` + KL controller, alarms, collapse guard),
``evaluate``, ``save``, ``finish``; ``train()`` hands it to the one loop (``trainers/engine/run.py``). Everything
random is a pure function of (seed, step) (``rl/streams.py``), so a resumed run reproduces an uninterrupted one
exactly (with the model, optimizer, KL-controller, alarm, prompt-filter and collapse-guard state restored).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import torch

from posttrain.losses.policy import batch_normalizers, merge_metrics, policy_loss
from posttrain.models.gpt import GPT
from posttrain.rewards.registry import build_reward
from posttrain.tasks.files import task_for
from posttrain.trainers import common, distributed, sharded
from posttrain.trainers.alarms import Alarms, CollapseGuard, watch_step
from posttrain.trainers.checkpoint import initial_model, write_snapshot
from posttrain.trainers.engine import device
from posttrain.trainers.engine.run import run as engine_run
from posttrain.trainers.engine.setup import open_training
from posttrain.trainers.guards import finite_step
from posttrain.trainers.pg_config import PRESETS, PolicyGradientConfig  # noqa: F401  (the trainer registry reads them here)
from posttrain.trainers.rl import common as rl
from posttrain.trainers.rl import group, setup
from posttrain.trainers.rl.group import GroupBatch, policy_logps, warp
from posttrain.trainers.rl.ppo_distributed import normalizers
from posttrain.trainers.rl.rollout import annealed_terms, rollout
from posttrain.trainers.rl.rollout_engine import matched
from posttrain.trainers.rl.schedule import backward_minibatch, micro_schedule, real_rows
from posttrain.trainers.rl.streams import epoch_order
from posttrain.trainers.weight_average import TailAverage


class PolicyGradientTrainer:
    """Thin loop: rollout -> group advantages -> clipped updates. State for exact resume lives here;
    ``__init__`` is the trainer's set-up (the run directory is written only once its inputs are checked)."""

    def __init__(self, cfg: PolicyGradientConfig, resume: str | None = None, overwrite: bool = False):
        setup.require_start(cfg, resume, "RL")
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
        self.model, self.tokenizer, self.opt = t.model, t.tokenizer, t.opt
        self.logger, self.manager = t.logger, t.manager
        self.model.train()
        self.share_prefix = cfg.share_prompt_prefix and isinstance(self.model, GPT) and not self.fsdp
        self.loss_options = group.loss_options(cfg)  # clipping, aggregation, entropy, KL estimator, objective
        self.kl_ctl = setup.kl_controller(cfg)
        self.alarms = Alarms(cfg.alarms, cfg.nan_patience)
        self.guard = rl.AlarmsGuard(self)  # the loop's one non-finite guard (trainers/engine/run.py)
        self.collapse, self.snapshot = CollapseGuard(cfg.alarms), None  # snapshot: weights + optimizer at the best
        self.tail = TailAverage(cfg.steps, cfg.average_last, cfg.average_every)  # the final model's weight average
        if (ckpt := t.ckpt) is not None:
            setup.restore(self, ckpt)  # the KL controller, the alarms, the collapse guard
            if self.prompt_history is not None and ckpt.state.get("prompt_history"):
                self.prompt_history.load_state_dict(ckpt.state["prompt_history"])
            self.tail.load(ckpt.path, ckpt.state.get("weight_average"), self.model)
        self.last_eval, self.initial = None, None

    def _build(self, start):
        """The policy: the resumed checkpoint's, or the --init / --model start (LoRA adapters on it when asked)."""
        model, tokenizer, self.chat = setup.policy(self.cfg, start)
        return model, tokenizer

    def _reference(self, t) -> None:
        """The *initial* policy (from --init, or the resumed run's own init), frozen; None with beta = 0."""
        self.ref_model = setup.reference(self.cfg, t.model, lambda: initial_model(t.init, t.ckpt))

    def _inputs(self, t) -> None:
        """The prompts and evaluation set, the prompt filter, the rollout engine and its settings, checked before
        anything is written (under several processes: whole groups per rank)."""
        cfg, w = self.cfg, t.world
        setup.check_groups_per_rank(cfg, w)
        ins = setup.rl_inputs(cfg, self.task, self.reward_fn, self.chat, t)
        self.data, self.fsdp, self.replica, self.engine = ins.data, ins.fsdp, ins.replica, ins.engine
        self.prompts, self.evals = self.data.train, self.data.evals  # rows with .prompt (the text) and .answer
        self.prompt_history = group.prompt_history(cfg, w, len(self.prompts))  # the prompt filter's, or None
        self.settings = group.rollout_settings(cfg)

    # ------------------------------------------------------------------------------------------ the batch
    def rollout(self, step: int) -> GroupBatch:
        """The step's samples and rewards (rl/rollout.py), then the reference log-probs, the group advantages,
        pi_old and the TIS weights (rl/group.py); on the run's device."""
        cfg = self.cfg
        sharded.sync_replica(self.replica, self.model)  # FSDP: the current weights into the sampler, on every rank
        sampler = self.model if self.replica is None else self.replica
        fading = annealed_terms(self.reward_fn, cfg.anneal_names, cfg.anneal_factor(step))
        ro = rollout(
            sampler,
            self.engine,
            self.tokenizer,
            self.data,
            self.reward_fn,
            self.settings,
            step,
            fading=fading,
            history=self.prompt_history,
            world=self.world,
        )
        b = group.group_batch(ro, step, cfg, ref_model=self.ref_model, beta=self.kl_ctl.value)
        b = group.correct(b, self.model, cfg, matched=matched(self.engine), share_prefix=self.share_prefix)
        return device.to_device(b)  # rewards and advantages (made on the CPU) beside the samples

    # ------------------------------------------------------------------------------------------ the loss
    def _micro_loss(self, b: GroupBatch, rows: torch.Tensor, norms: dict):
        cfg = self.cfg
        mask = b.completion_mask[rows]
        W = int(mask.sum(-1).max()) if mask.any() else 1  # trim completion padding shared by all rows
        P = b.prompt_length
        seqs, attn, mask = b.sequences[rows, : P + W], b.attention_mask[rows, : P + W], mask[:, :W]
        logps, entropy = policy_logps(
            self.model, seqs, attn, P, b.prompt_index[rows], mask, warp(cfg), self.share_prefix, entropy=True
        )
        return policy_loss(
            logps,
            b.old_logps[rows, :W],
            b.advantages[rows],
            mask,
            entropy=entropy,
            ref_logps=b.ref_logps[rows, :W] if b.ref_logps is not None else None,
            beta=self.kl_ctl.value if cfg.kl_in == "loss" else 0.0,
            is_weights=b.is_weights[rows, :W] if b.is_weights is not None else None,
            **norms,
            **self.loss_options,
        )

    def update(self, b: GroupBatch, step: int) -> dict:
        """mu epochs x minibatches x grad_accum micro-batches (rl/schedule.py); non-finite steps skipped. Under
        torchrun each rank runs its rows of every global minibatch: global normalisers, gradients summed."""
        cfg, w = self.cfg, self.world
        N = b.sequences.shape[0]
        apply = b.apply if not w.distributed else distributed.global_sum(int(b.apply), w) > 0  # one decision
        if not apply:  # dynamic sampling found no group with signal: measure only (no Adam momentum step)
            with torch.no_grad():
                norms = batch_normalizers(b.completion_mask, max_len=cfg.max_new_tokens)
                _, met = self._micro_loss(b, torch.arange(N), norms)
            return {**met, "grad_norm": 0.0, "skipped_updates": 0}
        N = N if b.apply else 0  # another rank has signal: this one takes part with no rows (zero gradient)
        parts, gnorms, skipped = [], [], 0
        offset, total = distributed.row_offsets(N, w)  # this rank's rows are [offset, offset + N) of the global batch
        for epoch in range(cfg.mu):
            order = epoch_order("grpo", cfg.seed, step, epoch, total, cfg.minibatches)
            for mb in micro_schedule(order, cfg.minibatches, cfg.grad_accum, offset, N, self.fsdp):
                rows = real_rows(mb)  # this rank's rows of the minibatch
                mask = b.completion_mask[rows if rows is not None else slice(0, 0)]
                norms = normalizers(mask, w, max_len=cfg.max_new_tokens)  # the global minibatch's
                loss_fn = lambda micro, k, norms=norms: self._micro_loss(b, micro, norms)  # noqa: E731
                mb_parts = backward_minibatch(mb, loss_fn, [self.model], w, self.fsdp)
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

    # ------------------------------------------------------------------------------------------ the shape
    def train_step(self, step: int) -> dict:
        """One rollout batch and its updates, then the KL controller, the alarms and the collapse guard."""
        cfg, t0 = self.cfg, time.perf_counter()
        lr = common.lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
        common.set_lr(self.opt, self.collapse.lr_scale * lr)
        b = self.rollout(step)
        t1 = time.perf_counter()
        upd = self.update(b, step)
        metrics = {**b.metrics, **upd, "time_update": time.perf_counter() - t1, "step_time": time.perf_counter() - t0}
        metrics["beta"] = self.kl_ctl.value
        # under torchrun: rank means, so that the KL controller, the alarms and the collapse guard decide alike
        metrics = distributed.mean_metrics(metrics, self.world)
        if "kl" in upd:
            self.kl_ctl.update(upd["kl"], 1)
        args = (self.alarms, self.collapse, self.model, self.opt, self.snapshot)
        self.snapshot = watch_step(step + 1, metrics, *args, reward=metrics["reward_mean"])
        self.tail.add(self.model, step + 1)  # the weights after this step, for the final model's average
        return metrics

    # the rest of the engine's Trainer shape, as every RL trainer has it (rl/common.py)
    evaluate, progress, early_stop, run_eval = rl.evaluate, rl.progress, rl.no_early_stop, rl.run_eval

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
        stopped, final_step = stopped_at is not None, stopped_at or self.cfg.steps
        last = self.last_eval if self.last_eval is not None else self.run_eval()
        final, last_weights = None, None
        if not stopped and self.tail.apply(self.model):  # the mean of the weights at self.tail.added
            last_weights, last = last, self.run_eval()
            print(f"final model: the mean of the weights at steps {', '.join(map(str, self.tail.added))}")
        if not stopped:
            final = rl.publish(self, final_step, last)
        summary = rl.summary(self, final_step, stopped, last, final, t_start)
        summary["heldout_accuracy_last_weights"] = (last_weights or last).accuracy  # before averaging
        summary["weight_average_steps"] = self.tail.added if last_weights else [final_step]  # the final model's steps
        return rl.close_run(self, summary, stopped_at, final, last)

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
