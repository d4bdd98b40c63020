"""PPO for language models: a critic, GAE, the clipped surrogate, value clipping and a KL-shaped reward.

Key insight: the lineage REINFORCE -> actor-critic -> PPO -> GRPO is one loop with different baselines and
trust regions. Here the baseline is a learned value V(s_t) per token, the advantage is GAE over the
KL-shaped token rewards, and the update reuses each rollout for ``mu`` epochs of minibatches:

    rollout:  y ~ pi_old;  score at the last real token; r_t = -beta KL_t(pi_old || pi_ref) (+ score at EOS)
              A, R = GAE(r, V_old; gamma, lam);  A whitened over real tokens        (rl/ppo_batch.py)
    update:   L = L_pi + c_v * 1/2 max((V - R)^2, (V_clip - R)^2)  (- c_ent * H, inside L_pi)
              L_pi = -min(rho A, clip(rho, 1 +- eps) A)     "clip"        clipped PPO (Schulman et al. 2017 sec. 3)
                   = -rho A + beta_old KL(pi_old || pi)     "kl_penalty"  KL-PPO (sec. 4), beta_old adapted
                   = -rho A                                 "pg"          with mu = minibatches = 1: A2C
              each loss a token mean over the minibatch's global token count (any grad_accum gives one update)

The configurations of the lineage are presets: ``a2c`` (one on-policy update per batch, no ratio clip, no
value clip: its gradient is the policy gradient with A = GAE advantages), ``kl_ppo``, and the default clipped
PPO; GRPO (group baseline, no critic) is ``posttrain grpo``. With lam = gamma = 1 and V = 0 the advantage is
the REINFORCE return (tests/losses/test_gae.py).

PPO = the shared rollout (``rl/rollout.py``, a function of values) + the value model (``rl/critic.py``) + GAE
(``rl/ppo_batch.py``) + epochs (``rl/schedule.py``); this file keeps the loss call, the update and the metrics.
Shape (every trainer's, ``trainers/engine/protocol.py``): :class:`PPOTrainer` ``__init__`` (set-up),
``train_step`` (rollout + update + KL controller + alarms + collapse guard), ``evaluate``, ``save``, ``finish``;
``train()`` hands it to the one loop. Everything random is a function of (seed, step) (``rl/streams.py``), and the
checkpoint holds the policy, the critic, both optimizers, beta and the RNG, so a resumed run ends bitwise equal to
an uninterrupted one (tested).

Under ``torchrun`` each rank trains on its share of every rollout with the global batch's statistics, so N
processes make 1's update (``rl/ppo_distributed.py``, tested); rollouts come from ``--engine`` with TIS weights.

``--fsdp`` shards policy and critic (FSDP2, ``trainers/sharded.py``; sharded checkpoints of both and their
optimizers); the frozen reference stays whole on each rank (no gradient or optimiser state, no collective);
rollouts and evaluation sample from a replica of the policy refreshed once per step.

Not handled: dynamic sampling, HF models with ``value_model=shared``, a reward model on another tokenizer, FSDP
with ``value_model=shared`` or LoRA, the collapse guard's snapshot in a sharded checkpoint (kept in memory only).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import torch

from posttrain.losses.kl import PPOKLController, kl_controller_from_state
from posttrain.losses.policy import merge_metrics, policy_loss, value_loss
from posttrain.losses.ppo import kl_penalty_policy_loss
from posttrain.models.gpt import GPT
from posttrain.rewards.registry import build_reward
from posttrain.tasks.files import task_for
from posttrain.trainers import common, distributed, sharded
from posttrain.trainers.alarms import Alarms, CollapseGuard, watch_step
from posttrain.trainers.checkpoint import initial_model, save_with_extras, write_snapshot
from posttrain.trainers.engine.run import run as engine_run
from posttrain.trainers.engine.setup import open_training
from posttrain.trainers.ppo_config import PRESETS, PPOConfig  # noqa: F401  (the trainer registry reads them here)
from posttrain.trainers.rl import common as rl
from posttrain.trainers.rl import ppo_distributed, setup
from posttrain.trainers.rl.critic import build_critic, load_critic, save_critic
from posttrain.trainers.rl.ppo_batch import ActorCritic, PPOBatch, forward, ppo_batch
from posttrain.trainers.rl.rollout import RolloutSettings, rollout
from posttrain.trainers.rl.rollout_engine import matched
from posttrain.trainers.rl.schedule import backward_minibatch, micro_schedule, real_rows
from posttrain.trainers.rl.streams import epoch_order


class PPOTrainer:
    """Thin loop: rollout -> mu epochs of clipped actor + critic updates. State lives here."""

    name = "ppo"

    def __init__(self, cfg: PPOConfig, resume: str | None = None, overwrite: bool = False):
        setup.require_start(cfg, resume, "PPO")
        self.cfg = cfg
        self.task = task_for(cfg, "prompts")  # --data (FileTask) or the embedded task: tasks/files.py
        self.reward_fn = build_reward(cfg.reward_spec, rm_path=cfg.reward_model, answer_field=cfg.answer_field)
        t = open_training(
            cfg,
            self.name,
            resume,
            overwrite,
            build=self._build,
            inputs=self._inputs,
            run_inputs=self._reference,
            keep_init=True,
            parts=self._critic_parts,
        )
        self.run, self.out, self.world, self.start_step = t.run, t.run.dir, t.world, t.start_step
        self.model, self.tokenizer, self.opt = t.model, t.tokenizer, t.opt
        self.logger, self.manager = t.logger, t.manager
        self.model.train()
        self.share_prefix = (  # not under FSDP: the shared prefix runs each model twice per micro-batch
            cfg.share_prompt_prefix
            and not self.fsdp
            and isinstance(self.model, GPT)
            and (self.critic is None or isinstance(self.critic.backbone.model, GPT))
        )
        self.kl_ctl = setup.kl_controller(cfg)
        self.kl_old_ctl = PPOKLController(cfg.kl_penalty_beta, cfg.kl_penalty_target)
        self.alarms = Alarms(cfg.alarms, cfg.nan_patience)
        self.guard = rl.AlarmsGuard(self)  # the loop's one non-finite guard (trainers/engine/run.py)
        self.collapse, self.snapshot = CollapseGuard(cfg.alarms), None
        if t.ckpt is not None:  # the critic from a plain checkpoint (a sharded one brought it with the policy)
            if not sharded.is_sharded_checkpoint(t.ckpt.path):
                load_critic(t.ckpt.path, self.critic_module, self.critic_opt)
            setup.restore(self, t.ckpt)
            self.kl_old_ctl = kl_controller_from_state(t.ckpt.state["kl_old_controller"])
        self.last_eval, self.initial = None, None

    def _build(self, start):
        """The critic (from the starting policy, before LoRA: it copies plain weights) and the policy."""
        self.start_model = initial_model(start.init, start.ckpt)  # the starting policy: the reference, the critic
        self.critic, self.shared_head = build_critic(self.cfg, self.start_model)  # rl/critic.py
        model, tokenizer, self.chat = setup.policy(self.cfg, start)
        return model, tokenizer

    def _reference(self, t) -> None:
        """A frozen copy of the starting policy (with LoRA: the policy with its adapters off); None with beta = 0."""
        self.ref_model = setup.reference(self.cfg, t.model, lambda: self.start_model)

    def _inputs(self, t) -> None:
        """The prompts and evaluation set and the rollout engine, checked before anything is written."""
        cfg = self.cfg
        ins = setup.rl_inputs(cfg, self.task, self.reward_fn, self.chat, t)
        self.data, self.fsdp, self.replica, self.engine = ins.data, ins.fsdp, ins.replica, ins.engine
        self.prompts, self.evals = self.data.train, self.data.evals  # rows with .prompt (the text) and .answer
        self.settings = RolloutSettings(cfg.seed, cfg.prompts_per_step, cfg.sampling, streams="ppo")

    def _critic_parts(self, t) -> dict:
        """The critic (its own model, or a head on the policy) and its optimizer, sharded beside the policy."""
        self.critic_module = self.shared_head if self.shared_head is not None else self.critic  # what is trained
        if self.fsdp:  # in place, per block then the root; FSDP's hooks reduce the gradients
            sharded.shard_model(self.critic, self.cfg.dtype)
        self.critic_opt = common.make_optimizer(self.critic_module, self.cfg.critic_lr, self.cfg.weight_decay)
        return {"critic": (self.critic_module, self.critic_opt)}

    # ------------------------------------------------------------------------------------------ the batch
    def rollout(self, step: int, beta: float) -> PPOBatch:
        """The step's samples and rewards (rl/rollout.py), then pi_old / V_old / pi_ref, the KL-shaped rewards at
        ``beta``, GAE and the TIS weights (rl/ppo_batch.py)."""
        sharded.sync_replica(self.replica, self.model)  # FSDP: the current weights into the sampler, on every rank
        sampler = self.model if self.replica is None else self.replica
        ro = rollout(
            sampler, self.engine, self.tokenizer, self.data, self.reward_fn, self.settings, step, world=self.world
        )
        m = ActorCritic(self.model, self.critic, self.shared_head, self.ref_model, self.share_prefix)
        return ppo_batch(
            ro, step, self.cfg, m, beta=beta, world=self.world, fsdp=self.fsdp, matched=matched(self.engine)
        )

    # ------------------------------------------------------------------------------------------ the loss
    def _micro_loss(self, b: PPOBatch, rows: torch.Tensor, norms: dict, train_policy: bool, outputs=None):
        # outputs: (logps, entropy, values) of these rows, already run (the rollout's pass, ppo_batch.recompute)
        cfg = self.cfg
        index = b.prompt_index[rows] if self.share_prefix else None
        seqs, attn, cmask = b.sequences[rows], b.attention_mask[rows], b.completion_mask[rows]
        warp = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
        lp, ent, values = outputs or forward(
            self.model,
            self.critic,
            self.shared_head,
            seqs,
            attn,
            cmask,
            b.prompt_length,
            index,
            **warp,
            need_entropy=True,
        )
        w = lp.shape[1]
        mask = b.completion_mask[rows, :w]
        old, adv = b.old_logps[rows, :w], b.advantages[rows, :w]
        is_w = None if b.is_weights is None else b.is_weights[rows, :w]
        kw = dict(agg="token_mean", entropy=ent, entropy_coef=cfg.entropy_coef, **norms, is_weights=is_w)
        if cfg.policy_objective == "clip":
            pl, met = policy_loss(lp, old, adv, mask, clip_eps_low=cfg.clip_eps, dual_clip=cfg.dual_clip, **kw)
        elif cfg.policy_objective == "kl_penalty":
            pl, met = kl_penalty_policy_loss(lp, old, adv, mask, beta=self.kl_old_ctl.value, **kw)
        else:
            pl, met = policy_loss(lp, old, adv, mask, clip_eps_low=None, **kw)
        vl, vmet = value_loss(
            values, b.old_values[rows, :w], b.returns[rows, :w], mask, clip_eps=cfg.vf_clip, agg="token_mean", **norms
        )
        loss = cfg.vf_coef * vl + (pl if train_policy else pl.detach())  # warm-up: the critic alone learns
        met = {**met, "loss": loss.item(), "value_loss": vl.item(), "value_clip_frac": vmet["value_clip_frac"]}
        return loss, met

    def update(self, b: PPOBatch, step: int, train_policy: bool) -> dict:
        """mu epochs x minibatches x grad_accum micro-batches (rl/schedule.py); the target-KL stop; non-finite steps
        skipped. Under torchrun each rank runs its rows of every global minibatch (rl/ppo_distributed.py): global
        normalisers, gradients summed over ranks, every decision on the global metrics."""
        cfg, w, critic = self.cfg, self.world, self.critic_module
        N = b.sequences.shape[0]
        offset, total = distributed.row_offsets(N, w)  # this rank's rows are [offset, offset + N) of the global batch
        parts, gnorms, cnorms, skipped, stopped, last_epoch = [], [], [], 0, False, []
        first, b.first_forward = b.first_forward, None  # the rollout's forward: the first minibatch's (then freed)
        for epoch in range(cfg.mu):
            order = epoch_order("ppo", cfg.seed, step, epoch, total, cfg.minibatches)
            for mb in micro_schedule(order, cfg.minibatches, cfg.grad_accum, offset, N, self.fsdp):
                rows = real_rows(mb)  # this rank's rows of the minibatch
                norms = ppo_distributed.normalizers(b.completion_mask[rows if rows is not None else slice(0, 0)], w)
                outputs = first or [None] * len(mb)  # the rollout's forward serves the first minibatch only

                def loss_fn(rows, k, norms=norms, outputs=outputs):
                    return self._micro_loss(b, rows, norms, train_policy, outputs[k])

                mb_parts = backward_minibatch(mb, loss_fn, [self.model, critic], w, self.fsdp)
                first = None
                met = ppo_distributed.minibatch_metrics(mb_parts, w)  # the global minibatch's, on every rank
                if cfg.target_kl is not None and train_policy and met["approx_kl"] > cfg.target_kl:
                    self.opt.zero_grad(set_to_none=True)
                    self.critic_opt.zero_grad(set_to_none=True)
                    stopped = True
                    break
                if not self.fsdp:  # FSDP has reduced them already
                    if train_policy:
                        ppo_distributed.all_reduce_grads(self.model, w)
                    ppo_distributed.all_reduce_grads(critic, w)
                gnorm = common.grad_norm_and_clip(self.model, cfg.grad_clip) if train_policy else 0.0
                cnorm = (
                    common.grad_norm_and_clip(critic, cfg.grad_clip)  # DTensor gradients: the norm over all shards
                    if self.fsdp
                    else ppo_distributed.clip_grad_norm(list(critic.parameters()), cfg.grad_clip)
                )
                if math.isfinite(met["loss"]) and math.isfinite(gnorm) and math.isfinite(cnorm):
                    if train_policy:
                        self.opt.step()
                    self.critic_opt.step()
                else:
                    skipped += 1  # a non-finite step is skipped and reported, never applied
                self.opt.zero_grad(set_to_none=True)
                self.critic_opt.zero_grad(set_to_none=True)
                parts.append(met)
                gnorms.append(gnorm)
                cnorms.append(cnorm)
                if epoch == cfg.mu - 1:
                    last_epoch.append(met)
            if stopped:
                break
        self.minibatch_metrics = parts  # per optimizer step, in order (the first has ratio exactly 1: tested)
        out = merge_metrics(parts)
        for k in ("loss", "pg_loss", "value_loss", "entropy_loss"):
            if k in out:
                out[k] /= max(1, len(parts))  # mean over optimizer steps
        out["num_tokens"] = distributed.global_sum(float(b.completion_mask.sum()), w)
        finite = gnorms and all(map(math.isfinite, gnorms))
        out["grad_norm"] = max(gnorms) if finite else (0.0 if not gnorms else math.nan)
        out["critic_grad_norm"] = max(cnorms) if cnorms and all(map(math.isfinite, cnorms)) else math.nan
        out["skipped_updates"], out["optimizer_steps"] = skipped, len(parts)
        out["epochs_done"] = len(parts) / cfg.minibatches  # < mu when the target-KL stop fired
        out["early_stopped"] = int(stopped)
        if "kl_old" in out and cfg.policy_objective == "kl_penalty" and train_policy:
            self.kl_old_ctl.update(merge_metrics(last_epoch or parts)["kl_old"])
        out["kl_old_beta"] = self.kl_old_ctl.value
        return out

    # ------------------------------------------------------------------------------------------ the shape
    def train_step(self, step: int) -> dict:
        """One rollout batch and its updates, then the KL controller, the alarms and the collapse guard."""
        cfg, t0 = self.cfg, time.perf_counter()
        warm = step < cfg.critic_warmup
        lr = common.lr_at(
            max(0, step - cfg.critic_warmup),
            cfg.lr,
            cfg.warmup_steps,
            max(1, cfg.steps - cfg.critic_warmup),
            cfg.min_lr_ratio,
        )
        common.set_lr(self.opt, self.collapse.lr_scale * lr)
        common.set_lr(self.critic_opt, common.lr_at(step, cfg.critic_lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio))
        beta = self.kl_ctl.value  # the beta this rollout's rewards were shaped with
        b = self.rollout(step, beta)
        t1 = time.perf_counter()
        upd = self.update(b, step, train_policy=not warm)
        metrics = {**b.metrics, **upd, "beta": beta, "critic_warmup": int(warm), "lr": lr}
        metrics.update(time_update=time.perf_counter() - t1, step_time=time.perf_counter() - t0)
        # Ziegler: n = sequences in the (global) batch; kl_per_seq is the global batch's, so beta is one on every rank
        self.kl_ctl.update(b.metrics["kl_per_seq"], int(distributed.global_sum(b.sequences.shape[0], self.world)))
        times = {k: v for k, v in metrics.items() if k.startswith("time_") or k == "step_time"}
        metrics.update(distributed.mean_metrics(times, self.world))  # the rest is the global batch's already
        reward = None if warm else metrics["reward_mean"]
        critic = (self.critic_module, self.critic_opt)
        args = (self.alarms, self.collapse, self.model, self.opt, self.snapshot)
        self.snapshot = watch_step(step + 1, metrics, *args, reward=reward, critic=critic)
        return metrics

    # the rest of the engine's Trainer shape, as every RL trainer has it (rl/common.py)
    evaluate, progress, early_stop, run_eval = rl.evaluate, rl.progress, rl.no_early_stop, rl.run_eval

    def _state(self, step: int, extra: dict | None = None) -> dict:
        return {
            "step": step,
            "trainer": self.name,
            "run_id": self.run.run_id,
            "config": dataclasses.asdict(self.cfg),
            "kl_controller": self.kl_ctl.state_dict(),
            "kl_old_controller": self.kl_old_ctl.state_dict(),
            "alarms": self.alarms.state_dict(),
            **(extra or {}),
        }

    def _extras(self, tmp: Path) -> None:
        """In a periodic checkpoint: the critic (weights + optimizer) and the collapse guard's snapshot."""
        save_critic(tmp, self.critic_module, self.critic_opt)
        write_snapshot(tmp, self.snapshot)

    def save(self, done: int, metrics: dict) -> None:
        """A periodic checkpoint: policy, critic, both optimizers, beta, RNG, alarms, collapse guard (rank 0 writes;
        under --fsdp every rank its shards of policy, critic and optimizers, without the guard's snapshot)."""
        rl.save_periodic(self, done, parts={"critic": (self.critic_module, self.critic_opt)})

    def finish(self, stopped_at: int | None, t_start: float) -> dict:
        """``model/`` with the critic beside the policy (unless the run stopped on non-finite updates),
        ``summary.json``; a stopped run then fails."""
        stopped, final_step = stopped_at is not None, stopped_at or self.cfg.steps
        last = self.last_eval if self.last_eval is not None else self.run_eval()
        final = None
        if not stopped:
            fsdp = sharded.is_sharded(self.model)
            critic = sharded.published(self.critic_module, self.world)  # FSDP: gathered to rank 0, as the policy

            def extras(tmp):  # the critic (its weights alone when gathered from the shards); no collapse snapshot
                save_critic(tmp, critic, None if fsdp else self.critic_opt)

            final = rl.publish(self, final_step, last, save=lambda d, **kw: save_with_extras(d, extras, **kw))
        summary = rl.summary(
            self, final_step, stopped, last, final, t_start, policy_objective=self.cfg.policy_objective
        )
        summary["beta"] = self.kl_ctl.value
        return rl.close_run(self, summary, stopped_at, final, last)

    def train(self) -> dict:
        cfg = self.cfg
        n_critic = sum(p.numel() for p in self.critic_module.parameters())
        print(
            f"PPO ({cfg.policy_objective}): {len(self.prompts)} training prompts, {cfg.prompts_per_step} x "
            f"{cfg.num_generations} samples/step, policy {common.n_params(self.model) / 1e6:.2f}M params, critic "
            f"{cfg.value_model} from {cfg.critic_source} ({n_critic / 1e6:.2f}M trained), reward {cfg.reward_spec}, "
            f"reference model: {'yes' if self.ref_model is not None else 'none (beta=0)'}, steps {self.start_step}->{cfg.steps}"
        )
        rl.start_eval(self)  # a fresh run's held-out accuracy, logged at step 0
        return engine_run(self)  # the one loop (trainers/engine/run.py)


def train_ppo(cfg: PPOConfig, resume: str | None = None, overwrite: bool = False) -> dict:
    return PPOTrainer(cfg, resume=resume, overwrite=overwrite).train()
