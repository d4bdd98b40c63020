"""PPO for language models: a critic, GAE, the clipped surrogate, value clipping and a KL-shaped reward.

Key insight: the lineage REINFORCE -> actor-critic -> PPO -> GRPO is one loop with different baselines and
trust regions. Here the baseline is a learned value V(s_t) per token, the advantage is GAE over the
KL-shaped token rewards, and the update reuses each rollout for ``mu`` epochs of minibatches:

    rollout:  y ~ pi_old;  score at the last real token; r_t = -beta KL_t(pi_old || pi_ref) (+ score at EOS)
              A, R = GAE(r, V_old; gamma, lam);  A whitened over real tokens           (ppo_rollout.py)
    update:   L = L_pi + c_v * 1/2 max((V - R)^2, (V_clip - R)^2)  (- c_ent * H, inside L_pi)
              L_pi = -min(rho A, clip(rho, 1 +- eps) A)     "clip"        clipped PPO (Schulman et al. 2017 sec. 3)
                   = -rho A + beta_old KL(pi_old || pi)     "kl_penalty"  KL-PPO (sec. 4), beta_old adapted
                   = -rho A                                 "pg"          with mu = minibatches = 1: A2C
              each loss a token mean over the minibatch's global token count (any grad_accum gives one update)

The configurations of the lineage are presets: ``a2c`` (one on-policy update per batch, no ratio clip, no
value clip: its gradient is the policy gradient with A = GAE advantages), ``kl_ppo``, and the default clipped
PPO; GRPO (group baseline, no critic) is ``posttrain grpo``. With lam = gamma = 1 and V = 0 the advantage is
the REINFORCE return (tests/losses/test_gae.py).

Shape (every trainer's, ``trainers/common.py``): :class:`PPOTrainer` ``__init__`` (set-up), ``train_step``
(rollout + update + KL controller + alarms + collapse guard), ``run_eval``, ``save``, ``finish``; ``train()``
is the loop. Everything random is a function of (seed, step), and the checkpoint holds the policy, the critic,
both optimizers, beta and the RNG, so a resumed run ends bitwise equal to an uninterrupted one (tested).

Under ``torchrun`` each rank trains on its share of every rollout with the global batch's statistics, so N
processes make 1's update (``ppo_distributed.py``, tested); rollouts come from ``--engine`` with TIS weights.

``--fsdp`` shards policy and critic (FSDP2, ``trainers/sharded.py``; sharded checkpoints of both and their
optimizers); the frozen reference stays whole on each rank (no gradient or optimiser state, no collective);
rollouts and evaluation sample from a replica of the policy refreshed once per step.

Not handled: dynamic sampling, HF models with ``value_model=shared``, a reward model on another tokenizer, FSDP
with ``value_model=shared`` or LoRA, the collapse guard's snapshot in a sharded checkpoint (kept in memory only).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from posttrain.chat import chat_tokenizer, resolve_chat
from posttrain.checkpoints.files import load_tensors, load_torch_state
from posttrain.errors import UserError
from posttrain.losses.kl import PPOKLController, kl_controller_from_state
from posttrain.losses.policy import merge_metrics, policy_loss, value_loss
from posttrain.losses.ppo import kl_penalty_policy_loss
from posttrain.models.gpt import GPT
from posttrain.models.lora import apply_lora, lora_config, merge_lora, reference_model
from posttrain.models.value import ValueHead, ValueModel
from posttrain.rewards.registry import build_reward
from posttrain.tasks.files import task_for
from posttrain.trainers import common, distributed, ppo_distributed, sharded
from posttrain.trainers.alarms import Alarms, CollapseGuard, watch_step
from posttrain.trainers.checkpoint import initial_model, load_snapshot, rng_state, save_with_extras, write_snapshot
from posttrain.trainers.engine.publish import publish_model
from posttrain.trainers.engine.run import run as engine_run
from posttrain.trainers.engine.setup import open_training
from posttrain.trainers.ppo_config import PRESETS, PPOConfig  # noqa: F401  (the trainer registry reads them here)
from posttrain.trainers.ppo_rollout import PPORollout, epoch_order, forward, make_rollout, micro_schedule
from posttrain.trainers.rl import common as rl
from posttrain.trainers.rl.common import kl_controller, rl_inputs

# beside the policy in a PPO checkpoint
CRITIC_FILE, CRITIC_OPTIMIZER_FILE = "critic.safetensors", "critic_optimizer.pt"


class PPOTrainer:
    """Thin loop: rollout (ppo_rollout.py) -> mu epochs of clipped actor + critic updates. State lives here."""

    TRAINER = "ppo"

    name = "ppo"

    def __init__(self, cfg: PPOConfig, resume: str | None = None, overwrite: bool = False):
        if not (cfg.init or cfg.model_path) and not resume:
            raise UserError(
                "PPO needs a starting policy: pass --init SFT_CHECKPOINT (e.g. the out dir of "
                "`posttrain sft`) or --model DIR"
            )
        self.cfg = cfg
        self.task = task_for(cfg, "prompts")  # --data (FileTask) or the embedded task: tasks/files.py
        self.reward_fn = build_reward(cfg.reward_spec, rm_path=cfg.reward_model, answer_field=cfg.answer_field)
        t = open_training(
            cfg,
            self.TRAINER,
            resume,
            overwrite,
            build=self._build,
            inputs=self._inputs,
            run_inputs=self._reference,
            keep_init=True,
            parts=self._critic_parts,
        )
        self.run, self.out, self.world, self.start_step = t.run, t.run.dir, t.world, t.start_step
        self.model, self.tokenizer, self.opt, self.logger, self.manager = (
            t.model,
            t.tokenizer,
            t.opt,
            t.logger,
            t.manager,
        )
        self.model.train()
        self.share_prefix = (  # not under FSDP: the shared prefix runs each model twice per micro-batch
            cfg.share_prompt_prefix
            and not self.fsdp
            and isinstance(self.model, GPT)
            and (self.critic is None or isinstance(self.critic.backbone.model, GPT))
        )
        self.kl_ctl = kl_controller(cfg)
        self.kl_old_ctl = PPOKLController(cfg.kl_penalty_beta, cfg.kl_penalty_target)
        self.alarms = Alarms(cfg.alarms, cfg.nan_patience)
        self.guard = rl.AlarmsGuard(self)  # the loop's one non-finite guard (trainers/engine/run.py)
        self.collapse, self.snapshot = CollapseGuard(cfg.alarms), None
        if t.ckpt is not None:
            self._restore(t.ckpt, self.critic_module)
        self.last_eval, self.initial = None, None

    def _build(self, start):
        """The critic (from the starting policy, before LoRA: it copies plain weights) and the policy."""
        init, ckpt = start.init, start.ckpt
        self.start_model = initial_model(init, ckpt)  # the starting policy: the reference and the critic's init
        self.critic, self.shared_head = self._build_critic(self.start_model)
        model, tokenizer = apply_lora((ckpt or init).model, lora_config(self.cfg)), (ckpt or init).tokenizer
        self.chat = resolve_chat(self.cfg.chat_template, tokenizer, [getattr(x, "path", None) for x in (ckpt, init)])
        return model, chat_tokenizer(tokenizer, self.chat)  # with a template, EOS is its end-of-turn token

    def _inputs(self, t) -> None:
        """The prompts and evaluation set and the rollout engine, checked before anything is written."""
        cfg = self.cfg
        ins = rl_inputs(cfg, self.task, self.reward_fn, self.chat, t)  # trainers/rl/common.py
        self.data, self.fsdp, self.replica, self.engine = ins.data, ins.fsdp, ins.replica, ins.engine
        self.prompts, self.evals = self.data.train, self.data.evals  # rows with .prompt (the text) and .answer

    def _reference(self, t) -> None:
        """A frozen copy of the starting policy (with LoRA the policy itself with its adapters switched off), made
        before the policy is placed or sharded."""
        start = self.start_model
        self.ref_model = (
            reference_model(t.model, lambda: common.frozen(copy.deepcopy(start))) if self.cfg.beta > 0 else None
        )

    def _critic_parts(self, t) -> dict:
        """The critic (its own model, or a head on the policy) and its optimizer, sharded beside the policy."""
        self.critic_module = self.shared_head if self.shared_head is not None else self.critic
        if self.fsdp:  # in place, per block then the root; FSDP's hooks reduce the gradients
            sharded.shard_model(self.critic)
        self.critic_opt = common.make_optimizer(self.critic_module, self.cfg.critic_lr, self.cfg.weight_decay)
        return {"critic": (self.critic_module, self.critic_opt)}

    def _build_critic(self, init_model):
        cfg = self.cfg
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

    def _restore(self, ckpt, critic_module) -> None:
        """The critic and its optimizer from a plain checkpoint (a sharded one brought them with the policy:
        open_training), the KL controllers', alarms' and collapse guard's state."""
        p = ckpt.path
        if not sharded.is_sharded_checkpoint(p):
            try:  # a corrupt or pickled file: one line naming it (load_tensors, load_torch_state)
                critic_module.load_state_dict(load_tensors(p / CRITIC_FILE))
                self.critic_opt.load_state_dict(load_torch_state(p / CRITIC_OPTIMIZER_FILE))
            except (OSError, RuntimeError, ValueError, KeyError) as e:
                raise UserError(
                    f"{p}: no usable critic ({CRITIC_FILE}, {CRITIC_OPTIMIZER_FILE}): {str(e).splitlines()[0]}"
                ) from None
        self.kl_ctl = kl_controller_from_state(ckpt.state["kl_controller"])
        self.kl_old_ctl = kl_controller_from_state(ckpt.state["kl_old_controller"])
        self.alarms.load_state_dict(ckpt.state["alarms"])
        if ckpt.state.get("collapse"):
            self.collapse.load_state_dict(ckpt.state["collapse"])
            self.snapshot = load_snapshot(p)

    # ------------------------------------------------------------------------------------------ update
    def _micro_loss(self, ro: PPORollout, rows: torch.Tensor, norms: dict, train_policy: bool, outputs=None):
        # outputs: (logps, entropy, values) of these rows, already run (the rollout's pass, ppo_rollout.recompute)
        cfg = self.cfg
        P = ro.prompt_length
        lp, ent, values = outputs or forward(
            self.model,
            self.critic,
            self.shared_head,
            ro.sequences[rows],
            ro.attention_mask[rows],
            ro.completion_mask[rows],
            P,
            ro.prompt_index[rows] if self.share_prefix else None,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            need_entropy=True,
        )
        w = lp.shape[1]
        mask = ro.completion_mask[rows, :w]
        old, adv = ro.old_logps[rows, :w], ro.advantages[rows, :w]
        kw = dict(
            agg="token_mean",
            entropy=ent,
            entropy_coef=cfg.entropy_coef,
            **norms,
            is_weights=None if ro.is_weights is None else ro.is_weights[rows, :w],
        )
        if cfg.policy_objective == "clip":
            pl, met = policy_loss(lp, old, adv, mask, clip_eps_low=cfg.clip_eps, dual_clip=cfg.dual_clip, **kw)
        elif cfg.policy_objective == "kl_penalty":
            pl, met = kl_penalty_policy_loss(lp, old, adv, mask, beta=self.kl_old_ctl.value, **kw)
        else:
            pl, met = policy_loss(lp, old, adv, mask, clip_eps_low=None, **kw)
        vl, vmet = value_loss(
            values, ro.old_values[rows, :w], ro.returns[rows, :w], mask, clip_eps=cfg.vf_clip, agg="token_mean", **norms
        )
        loss = cfg.vf_coef * vl + (pl if train_policy else pl.detach())  # warm-up: the critic alone learns
        met = {**met, "loss": loss.item(), "value_loss": vl.item(), "value_clip_frac": vmet["value_clip_frac"]}
        return loss, met

    def _params(self, which: str) -> list:
        if which == "policy":
            return list(self.model.parameters())
        return list((self.shared_head if self.shared_head is not None else self.critic).parameters())

    def update(self, ro: PPORollout, step: int, train_policy: bool) -> dict:
        """mu epochs x minibatches x grad_accum micro-batches; the target-KL stop; non-finite steps skipped. Under
        torchrun each rank runs its rows of every global minibatch (ppo_distributed.py): global normalisers,
        gradients summed over ranks, every decision on the global metrics."""
        cfg, w = self.cfg, self.world
        N = ro.sequences.shape[0]
        offset, total = distributed.row_offsets(N, w)  # this rank's rows are [offset, offset + N) of the global batch
        parts, gnorms, cnorms, skipped, stopped, last_epoch = [], [], [], 0, False, []
        critic = self._critic()
        first, ro.first_forward = ro.first_forward, None  # the rollout's forward: the first minibatch's (then freed)
        for epoch in range(cfg.mu):
            order = epoch_order(cfg.seed, step, epoch, total, cfg.minibatches)
            for mb in micro_schedule(order, cfg, offset, N, w, self.fsdp):  # [(rows, dummy), ...] per minibatch
                real = [rows for rows, dummy in mb if not dummy]
                norms = ppo_distributed.normalizers(
                    ro.completion_mask[torch.cat(real)] if real else ro.completion_mask[:0], w
                )
                mb_parts = []
                for k, (rows, dummy) in enumerate(mb):
                    last = k == len(mb) - 1  # FSDP reduces the gradients on the last micro-batch only
                    with sharded.no_sync(self.model, last), sharded.no_sync(critic, last):
                        loss, met = self._micro_loss(ro, rows, norms, train_policy, first[k] if first else None)
                        if dummy or self.fsdp:  # FSDP averages over ranks: W x this rank's share sums to the total
                            loss = loss * (0.0 if dummy else distributed.ddp_loss_scale(w))
                        loss.backward()
                    if not dummy:
                        mb_parts.append(met)
                first = None  # used by the first minibatch only
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
                    else ppo_distributed.clip_grad_norm(self._params("critic"), cfg.grad_clip)
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
        n = max(1, len(parts))
        for k in ("loss", "pg_loss", "value_loss", "entropy_loss"):
            if k in out:
                out[k] /= n  # mean over optimizer steps
        out["num_tokens"] = distributed.global_sum(float(ro.completion_mask.sum()), w)
        out["grad_norm"] = (
            max(gnorms) if gnorms and all(map(math.isfinite, gnorms)) else (0.0 if not gnorms else math.nan)
        )
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
        sharded.sync_replica(self.replica, self.model)  # FSDP: the current weights into the sampler, on every rank
        ro = make_rollout(self, step)
        t1 = time.perf_counter()
        upd = self.update(ro, step, train_policy=not warm)
        metrics = {
            **ro.metrics,
            **upd,
            "beta": beta,
            "critic_warmup": int(warm),
            "lr": lr,
            "time_update": time.perf_counter() - t1,
            "step_time": time.perf_counter() - t0,
        }
        # Ziegler: n = sequences in the (global) batch; kl_per_seq is the global batch's, so beta is one on every rank
        self.kl_ctl.update(ro.metrics["kl_per_seq"], int(distributed.global_sum(ro.sequences.shape[0], self.world)))
        metrics.update(
            distributed.mean_metrics(
                {k: v for k, v in metrics.items() if k.startswith("time_") or k == "step_time"}, self.world
            )
        )  # the rest is the global batch's already: the times, rank means
        self.snapshot = watch_step(
            step + 1,
            metrics,
            self.alarms,
            self.collapse,
            self.model,
            self.opt,
            self.snapshot,
            reward=None if warm else metrics["reward_mean"],
            critic=(self._critic(), self.critic_opt),
        )
        return metrics

    def run_eval(self):
        return rl.heldout_eval(self.model, self.replica, self.data, self.tokenizer, self.cfg.max_new_tokens)

    def _state(self, step: int, extra: dict | None = None) -> dict:
        return {
            "step": step,
            "trainer": self.TRAINER,
            "run_id": self.run.run_id,
            "config": dataclasses.asdict(self.cfg),
            "kl_controller": self.kl_ctl.state_dict(),
            "kl_old_controller": self.kl_old_ctl.state_dict(),
            "alarms": self.alarms.state_dict(),
            **(extra or {}),
        }

    def _extras(self, tmp: Path, with_snapshot: bool = True, critic=None) -> None:
        """The critic (weights + optimizer; ``critic`` given: its weights alone) and the collapse guard's snapshot,
        inside the checkpoint being written."""
        save_file(
            {k: v.detach().clone().contiguous() for k, v in (critic or self._critic()).state_dict().items()},
            str(tmp / CRITIC_FILE),
        )
        if critic is None:
            torch.save(self.critic_opt.state_dict(), tmp / CRITIC_OPTIMIZER_FILE)
        if with_snapshot:
            write_snapshot(tmp, self.snapshot)

    def _critic(self) -> torch.nn.Module:
        """What the critic optimizer trains: the shared value head, or the separate value model."""
        return self.shared_head if self.shared_head is not None else self.critic

    def save(self, done: int, metrics: dict) -> None:
        """A periodic checkpoint: policy, critic, both optimizers, beta, RNG, alarms, collapse guard (rank 0 writes;
        under --fsdp every rank its shards of policy, critic and optimizers, without the guard's snapshot)."""
        rl.save_periodic(self, done, parts={"critic": (self._critic(), self.critic_opt)})

    def finish(self, stopped_at: int | None, t_start: float) -> dict:
        cfg, last_eval, initial = self.cfg, self.last_eval, self.initial
        stopped, final_step = stopped_at is not None, stopped_at or cfg.steps
        if last_eval is None:
            last_eval = self.run_eval()
        final = None
        if not stopped:
            if cfg.merge_lora:  # model/ with full weights, no adapter files
                self.model = merge_lora(self.model)
            fsdp = sharded.is_sharded(self.model)
            critic = sharded.published(self._critic(), self.world)  # FSDP: gathered to rank 0, as the policy below

            def extras(tmp):  # the critic beside the policy (gathered under --fsdp); no collapse snapshot
                self._extras(tmp, with_snapshot=False, critic=critic if fsdp else None)

            state = self._state(final_step, {"heldout_accuracy": last_eval.accuracy})
            final = publish_model(
                self.out,
                self.model,
                self.tokenizer,
                state,
                self.opt,
                self.world,
                rng_state(),
                save=lambda d, **kw: save_with_extras(d, extras, **kw),
            )
        summary = {
            "trainer": self.TRAINER,
            "policy_objective": cfg.policy_objective,
            "steps": final_step,
            "stopped_early": stopped,
            "heldout_accuracy": last_eval.accuracy,
            "heldout_accuracy_start": initial.accuracy if initial else None,
            "heldout_n": last_eval.n,
            "train_seconds": time.perf_counter() - t_start,
            "beta": self.kl_ctl.value,
            "alarms": self.alarms.summary(),
            "restores": self.collapse.restores,
            "model_dir": str(final) if final else None,
            "samples": last_eval.samples,
        }
        return rl.close_run(self, summary, stopped_at, final, last_eval)

    def train(self) -> dict:
        cfg = self.cfg
        n_critic = sum(p.numel() for p in self._params("critic"))
        print(
            f"PPO ({cfg.policy_objective}): {len(self.prompts)} training prompts, {cfg.prompts_per_step} x "
            f"{cfg.num_generations} samples/step, policy {common.n_params(self.model) / 1e6:.2f}M params, critic "
            f"{cfg.value_model} from {cfg.critic_source} ({n_critic / 1e6:.2f}M trained), reward {cfg.reward_spec}, "
            f"reference model: {'yes' if self.ref_model is not None else 'none (beta=0)'}, steps {self.start_step}->{cfg.steps}"
        )
        rl.start_eval(self)  # a fresh run's held-out accuracy, logged at step 0
        return engine_run(self)  # the one loop (trainers/engine/run.py)

    # the rest of the engine's Trainer shape: evaluate, progress, early_stop
    def evaluate(self, done: int, metrics: dict) -> None:
        rl.evaluate(self, done, metrics)

    def progress(self, metrics: dict) -> dict:
        return rl.progress(self, metrics)

    def early_stop(self, done: int) -> None:
        return None  # a non-finite streak is the guard's (the alarms: rl.AlarmsGuard)


def train_ppo(cfg: PPOConfig, resume: str | None = None, overwrite: bool = False) -> dict:
    return PPOTrainer(cfg, resume=resume, overwrite=overwrite).train()
