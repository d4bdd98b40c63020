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

Shape (every trainer's, ``trainers/common.py``), as methods of :class:`PolicyGradientTrainer`, whose state
lives on the instance: ``__init__`` is the set-up, ``train_step(step)`` (= ``rollout`` + ``update`` + KL
controller, alarms, collapse guard), ``run_eval``, ``save``, ``finish``; ``train()`` is the loop over them.

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
from dataclasses import dataclass
from pathlib import Path

import torch

from posttrain.chat import chat_tokenizer, resolve_chat
from posttrain.config import check_fields, knob
from posttrain.data.conversations import BAD_LINE_HELP, CHAT_TEMPLATE_HELP
from posttrain.data.prompts import rl_data
from posttrain.engines import build_engine, engine_knob
from posttrain.errors import ConfigError, UserError
from posttrain.generate import SamplingConfig
from posttrain.losses.advantages import ADVANTAGE_ESTIMATORS
from posttrain.losses.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_controller_from_state,
)
from posttrain.losses.policy import AGGREGATIONS, batch_normalizers, merge_metrics, policy_loss
from posttrain.losses.policy_objectives import OBJECTIVE_OPTIONS, POLICY_OBJECTIVES
from posttrain.models.gpt import GPT
from posttrain.models.loading import model_path_knob, pad_token_knob
from posttrain.models.lora import apply_lora, lora_config, lora_knob, merge_lora, reference_model
from posttrain.progress import tqdm  # a bar on a terminal, a line every 10 % in a log
from posttrain.rewards.registry import build_reward, parse_reward_spec, resolve_reward_spec
from posttrain.scoring import completion_logps, prefix_shared_completion_logps
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from posttrain.trainers import common, distributed, engine_rollout, pg_rollout
from posttrain.trainers.alarms import AlarmConfig, Alarms, CollapseGuard, watch_step
from posttrain.trainers.checkpoint import (
    CheckpointManager,
    initial_model,
    load_checkpoint,
    load_snapshot,
    restore_rng,
    rng_state,
    save_checkpoint,
    save_with_snapshot,
    start_policy,
)
from posttrain.trainers.guards import TrainingDiverged, finite_step
from posttrain.trainers.pg_rollout import ESTIMATOR_OPTIONS, Rollout, step_generator  # noqa: F401  (ESTIMATOR_OPTIONS re-exported)
from posttrain.trainers.trainer_config import TrainerConfig, override


@dataclass
class PolicyGradientConfig(TrainerConfig):
    out: str = override("out", "runs/grpo")
    init: str | None = knob(None, "SFT checkpoint (or run directory) to start from; required")
    algo: str = knob("grpo", "advantage estimator: reinforce | rloo | grpo", choices=tuple(ADVANTAGE_ESTIMATORS))
    steps: int = override("steps", 700, "optimizer steps (one rollout batch each when mu=1 and minibatches=1)")
    prompts_per_step: int = knob(32, "distinct prompts per rollout batch", gt=0)
    num_generations: int = knob(8, "samples per prompt (G)", gt=0)
    max_new_tokens: int = knob(6, "completion length limit in tokens (EOS included)", gt=0)
    temperature: float = knob(1.0, "sampling temperature (the loss uses the same warped distribution)", gt=0)
    top_k: int | None = knob(None, "sampling top-k (None = off)", ge=1)
    top_p: float | None = knob(None, "sampling top-p (None = off)", gt=0, le=1)
    lr: float = override("lr", 3e-4, "learning rate (AdamW, constant after warmup unless min_lr_ratio < 1)")
    min_lr_ratio: float = override("min_lr_ratio", 1.0)
    mu: int = knob(1, "optimisation epochs over each rollout batch (pi_old fixed at sampling)", gt=0)
    minibatches: int = knob(1, "optimizer steps per epoch: the rollout batch is split into this many minibatches", gt=0)
    grad_accum: int = knob(1, "micro-batches per minibatch (loss and gradients are identical for any value)", gt=0)
    clip_eps_low: float = knob(0.2, "PPO clip: ratio >= 1 - clip_eps_low", ge=0, le=1)
    clip_eps_high: float | None = knob(None, "PPO clip: ratio <= 1 + clip_eps_high (None = clip_eps_low; DAPO uses 0.28)",
                                       ge=0)
    dual_clip: float | None = knob(None, "dual clip constant c > 1 for negative advantages (None = off)", gt=1)
    ratio_level: str = knob("token", "importance ratio per token, or per sequence (GSPO)", choices=("token", "sequence"))
    objective: str = knob("clip", "policy objective (TRL loss_type): clip (PPO/GRPO/DAPO/GSPO; LUSPO with loss_agg "
                                  "seq_mean_token_sum) | cispo (ratio capped at 1 + clip_eps_high) | sapo | vespo",
                          choices=tuple(POLICY_OBJECTIVES))
    sapo_temperature_pos: float = knob(1.0, "SAPO gate temperature where A > 0", gt=0)
    sapo_temperature_neg: float = knob(1.05, "SAPO gate temperature where A <= 0", gt=0)
    vespo_k_pos: float = knob(2.0, "VESPO power k where A >= 0", ge=0)
    vespo_lambda_pos: float = knob(3.0, "VESPO decay lambda where A >= 0", gt=0)
    vespo_k_neg: float = knob(3.0, "VESPO power k where A < 0", ge=0)
    vespo_lambda_neg: float = knob(2.0, "VESPO decay lambda where A < 0", gt=0)
    kl_bias_correction: bool = knob(False, "KL term times the importance ratio (DeepSeek-V3.2; TRL's use_bias_correction_kl, "
                                           "on by default there)")
    loss_agg: str = knob("seq_mean_token_mean", "loss aggregation", choices=tuple(AGGREGATIONS))
    scale_rewards: str = knob("group", "GRPO std scaling: group | batch | none (Dr. GRPO)", choices=("group", "batch", "none"))
    reinforce_baseline: str = knob("batch_mean", "REINFORCE baseline: none | batch_mean", choices=("none", "batch_mean"))
    beta: float = knob(0.0, "KL coefficient to the reference (initial) model; 0 = no reference model is built", ge=0)
    kl_estimator: str = knob("k3", "KL estimator: k1 | k2 | k3", choices=tuple(KL_ESTIMATORS))
    kl_in: str = knob("loss", "apply the KL in the loss or fold it into the reward", choices=("loss", "reward"))
    kl_control: str = knob("fixed", "KL coefficient: fixed | adaptive (Ziegler et al.)", choices=("fixed", "adaptive"))
    kl_target: float = knob(0.05, "adaptive KL: target KL per token (nats)", gt=0)
    kl_horizon: float = knob(1000.0, "adaptive KL: horizon (in steps)", gt=0)
    entropy_coef: float = knob(0.0, "entropy bonus coefficient", ge=0)
    dynamic_sampling: bool = knob(True, "DAPO dynamic sampling: train only on groups whose rewards are not all equal, "
                                         "drawing more prompt batches to refill prompts_per_step groups")
    max_sample_rounds: int = knob(4, "dynamic sampling: prompt batches drawn per step at most (the first is the usual one)",
                                  ge=1)
    share_prompt_prefix: bool = knob(True, "run each prompt once per update and share its keys/values across its G "
                                           "samples (exact; posttrain GPT only, HF models use a full forward)")
    reward: str = knob("exact_match:1.0,digits:0.5", "weighted reward spec, e.g. 'exact_match:1.0,format:0.1' "
                       "(default: exact match plus partial credit for digits right; docs/outcomes.md)")
    seed: int = override("seed", 0, "seed for prompt order, sampling and minibatch order")
    task: ArithmeticConfig = knob(factory=ArithmeticConfig, help="embedded task (prompts from its training split)")
    alarms: AlarmConfig = knob(factory=AlarmConfig, help="silent-failure alarms")
    data: str | None = knob(None, "JSONL/Parquet of RL prompts, one per row; every other column goes to the reward "
                                  "functions by name (default: the embedded task; docs/your_data.md)")
    eval_data: str | None = knob(None, "held-out prompts (same format) for the greedy held-out accuracy (needed with data)")
    prompt_field: str = knob("prompt", "the data column holding the prompt: a string or a list of messages")
    answer_field: str = knob("answer", "the column the exact_match / digits / math rewards read as the reference")
    chat_template: str = knob("auto", CHAT_TEMPLATE_HELP)
    on_bad_line: str = knob("error", BAD_LINE_HELP, choices=("error", "skip"))
    reward_anneal: str = knob("", "comma-separated reward terms (of --reward) whose weight falls linearly to 0 "
                                  "from step reward_anneal_start*steps to the end, e.g. 'digits' (shaping that "
                                  "helps early and costs late); the logged reward_mean stays the full spec's")
    reward_anneal_start: float = knob(0.5, "fraction of the steps after which the reward_anneal terms start to "
                                           "fall", ge=0, lt=1)
    reward_model: str | None = knob(None, "a `posttrain rm` checkpoint scored as the 'reward_model' reward (z-scored with "
                                    "its saved stats; loaded once): alone it makes the reward 'reward_model:1.0', with "
                                    "--reward the spec must name it, e.g. 'reward_model:1.0,format:0.1'")

    def __post_init__(self):
        check_fields(self)  # choices, bounds and finiteness, from the knobs above
        self.reward = resolve_reward_spec(self.reward, self.reward_model, default=type(self).reward)
        unknown = sorted(set(self.anneal_names) - set(parse_reward_spec(self.reward)))
        if unknown:
            raise ConfigError(f"reward_anneal={self.reward_anneal!r}: {', '.join(unknown)} not in reward={self.reward!r}")
        if self.algo == "rloo" and self.num_generations < 2:
            raise ConfigError("algo=rloo needs num_generations >= 2")
        n = self.prompts_per_step * self.num_generations
        if n % self.minibatches or (n // self.minibatches) % self.grad_accum:
            raise ConfigError(f"prompts_per_step*num_generations={n} must split evenly into minibatches={self.minibatches} "
                              f"x grad_accum={self.grad_accum}")
        if self.kl_control == "adaptive" and self.beta == 0:
            raise ConfigError("kl_control=adaptive needs beta > 0 (its starting value)")

    @property
    def anneal_names(self) -> list[str]:
        return [t.strip() for t in self.reward_anneal.split(",") if t.strip()]

    def anneal_factor(self, step: int) -> float:
        """Weight factor of the annealed terms at 0-based ``step``: 1 up to t0 = reward_anneal_start * steps,
        then (steps - step) / (steps - t0), reaching 1 / (steps - t0) at the last step."""
        t0 = self.reward_anneal_start * self.steps
        return 1.0 if step <= t0 else max(0.0, (self.steps - step) / (self.steps - t0))

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                              top_p=self.top_p, num_samples=self.num_generations)

    # a local Hugging Face model (or posttrain checkpoint) to start from, and LoRA (models/loading.py, models/lora.py)
    model_path: str | None = model_path_knob()
    pad_token: str | None = pad_token_knob()
    lora_r: int = lora_knob("r")
    lora_alpha: float = lora_knob("alpha")
    lora_dropout: float = lora_knob("dropout")
    lora_target_modules: tuple[str, ...] = lora_knob("target_modules")
    merge_lora: bool = lora_knob("merge")
    engine: str = engine_knob("engine")  # rollout engine and truncated IS (posttrain/engines/, trainers/engine_rollout.py)
    tis_cap: float = engine_knob("tis_cap")
    tis_level: str = engine_knob("tis_level")


PRESETS: dict[str, dict] = {
    "tiny": {},
    # the defaults before the seed sweep of docs/outcomes.md: lr 1e-4, no dynamic sampling, no collapse restore,
    # exact-match reward only
    "classic": {"steps": 500, "lr": 1e-4, "dynamic_sampling": False, "alarms": {"collapse_fraction": 0.0},
                "reward": "exact_match:1.0"},
    "rloo": {"algo": "rloo"},
    "reinforce": {"algo": "reinforce"},
    "dapo": {"clip_eps_high": 0.28, "loss_agg": "token_mean"},
    "dr_grpo": {"scale_rewards": "none", "loss_agg": "seq_mean_token_sum_norm"},
    "cispo": {"objective": "cispo", "clip_eps_high": 4.0, "loss_agg": "token_mean"},  # TRL: epsilon_high=5.0
    "sapo": {"objective": "sapo"},
    "luspo": {"ratio_level": "sequence", "loss_agg": "seq_mean_token_sum"},
    "vespo": {"objective": "vespo", "loss_agg": "token_mean"},
}

class PolicyGradientTrainer:
    """Thin loop: rollout -> score -> advantages -> clipped updates. State for exact resume lives here;
    ``__init__`` is the trainer's set-up (the run directory is written only once its inputs are checked)."""

    def __init__(self, cfg: PolicyGradientConfig, resume: str | None = None, overwrite: bool = False):
        if not (cfg.init or cfg.model_path) and not resume:
            raise UserError("RL needs a starting policy: pass --init SFT_CHECKPOINT (e.g. the out dir of "
                            "`posttrain sft`) or --model DIR")
        self.cfg = cfg
        common.set_threads(cfg.threads)
        self.world = w = distributed.init()  # one process, or this rank under torchrun
        if w.distributed:  # groups stay whole on one rank; batch-wide statistics would differ per rank
            if cfg.prompts_per_step % w.world_size:
                raise ConfigError(f"prompts_per_step={cfg.prompts_per_step} must be divisible by the number of "
                                  f"processes ({w.world_size}): each rank samples whole groups")
            if (cfg.algo == "grpo" and cfg.scale_rewards == "batch") or (cfg.algo == "reinforce"
                                                                          and cfg.reinforce_baseline == "batch_mean"):
                raise ConfigError("batch-wide advantage statistics (scale_rewards=batch, reinforce_baseline=batch_mean) "
                                  "are per rank under several processes; use group statistics or one process")
        self.run = common.open_run(cfg, "policy_gradient", resume=resume, overwrite=overwrite)
        self.out = self.run.dir
        self.task = ArithmeticTask(cfg.task)
        self.reward_fn = build_reward(cfg.reward, rm_path=cfg.reward_model, answer_field=cfg.answer_field)
        common.seed_everything(cfg.seed)
        self.start_step = 0
        ckpt = None
        if resume:
            ckpt = load_checkpoint(self.run.resume_from, with_training_state=True, expect_trainer="policy_gradient")
            self.start_step = ckpt.step
            common.check_resume_step(ckpt.path, self.start_step, cfg.steps)
        init = start_policy(cfg, "grpo")
        src = ckpt or init
        self.model, self.tokenizer = apply_lora(src.model, lora_config(cfg)), src.tokenizer
        self.chat = resolve_chat(cfg.chat_template, self.tokenizer, [getattr(x, "path", None) for x in (ckpt, init)])
        self.tokenizer = chat_tokenizer(self.tokenizer, self.chat)  # with a template, EOS is its end-of-turn token
        self.data = rl_data(task=self.task, data=cfg.data, eval_data=cfg.eval_data, reward_fn=self.reward_fn,
                            tokenizer=self.tokenizer, model=self.model, max_new_tokens=cfg.max_new_tokens,
                            prompt_field=cfg.prompt_field, chat=self.chat, on_bad_line=cfg.on_bad_line)
        self.prompts, self.evals = self.data.train, self.data.evals  # rows with .prompt (the text) and .answer
        self.engine = build_engine(cfg, self.model, self.tokenizer, model_dir=cfg.model_path)  # samples the rollouts
        self.model.train()
        # the reference is the *initial* policy: from --init, or from the resumed run's own init
        self.ref_model = None
        if cfg.beta > 0:
            # a frozen copy of the starting policy; with LoRA the policy itself with its adapters switched off
            self.ref_model = reference_model(self.model, lambda: common.frozen(copy.deepcopy(initial_model(init, ckpt))))
        self.kl_ctl = (AdaptiveKLController(cfg.beta, cfg.kl_target, cfg.kl_horizon) if cfg.kl_control == "adaptive"
                       else FixedKLController(cfg.beta))
        self.alarms = Alarms(cfg.alarms, cfg.nan_patience)
        self.collapse, self.snapshot = CollapseGuard(cfg.alarms), None  # snapshot: weights + optimizer at the best
        self.opt = common.make_optimizer(self.model, cfg.lr, cfg.weight_decay)
        if ckpt is not None:
            self.opt.load_state_dict(ckpt.optimizer_state)
            if ckpt.rng_state is not None:
                restore_rng(ckpt.rng_state)
            self.kl_ctl = kl_controller_from_state(ckpt.state["kl_controller"])
            self.alarms.load_state_dict(ckpt.state["alarms"])
            if ckpt.state.get("collapse"):
                self.collapse.load_state_dict(ckpt.state["collapse"])
                self.snapshot = load_snapshot(ckpt.path)
        max_len = getattr(getattr(self.model, "config", None), "max_seq_len", None)
        if max_len is not None and not cfg.data and self.task.max_prompt_len + 1 + cfg.max_new_tokens > max_len:
            raise UserError(f"prompt + {cfg.max_new_tokens} new tokens exceed model.max_seq_len={max_len}")
        common.begin_run(self.run, cfg)
        self.logger = common.MetricsLogger(self.out, cfg.logger, resume_step=self.start_step if resume else None)
        self.manager = CheckpointManager(self.out, keep=cfg.keep_checkpoints)

    # ------------------------------------------------------------------------------------------ rollout
    def _draw(self, step: int, rnd: int):
        return pg_rollout.draw(self, step, rnd)

    def rollout(self, step: int) -> Rollout:
        return engine_rollout.correct_rollout(self, pg_rollout.rollout(self, step))  # pi_old and TIS weights

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
        if cfg.share_prompt_prefix and isinstance(self.model, GPT):
            logps, entropy = prefix_shared_completion_logps(
                self.model, seqs, attn, P, ro.prompt_index[rows], temperature=cfg.temperature, top_k=cfg.top_k,
                top_p=cfg.top_p, completion_mask=mask[:, :width])
        else:
            logps, entropy = completion_logps(self.model, seqs, attn, P, temperature=cfg.temperature, top_k=cfg.top_k,
                                              top_p=cfg.top_p, completion_mask=mask[:, :width], return_entropy=True)
        return policy_loss(
            logps, ro.old_logps[rows, :width], ro.advantages[rows], mask[:, :width],
            clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high, dual_clip=cfg.dual_clip,
            ratio_level=cfg.ratio_level, agg=cfg.loss_agg, entropy=entropy, entropy_coef=cfg.entropy_coef,
            ref_logps=ro.ref_logps[rows, :width] if ro.ref_logps is not None else None,
            beta=self.kl_ctl.value if cfg.kl_in == "loss" else 0.0, kl_estimator=cfg.kl_estimator, **norms,
            objective=cfg.objective, kl_bias_correction=cfg.kl_bias_correction,
            objective_kwargs={k: getattr(cfg, f"{cfg.objective}_{k}") for k in OBJECTIVE_OPTIONS[cfg.objective]},
            is_weights=ro.is_weights[rows, :width] if ro.is_weights is not None else None,
        )

    def update(self, ro: Rollout, step: int) -> dict:
        cfg, w = self.cfg, self.world
        N = ro.sequences.shape[0]
        apply = ro.apply if not w.distributed else distributed.global_sum(int(ro.apply), w) > 0  # one decision
        if not apply:  # dynamic sampling found no group with signal: measure only (no Adam momentum step)
            with torch.no_grad():
                _, met = self._micro_loss(ro, torch.arange(N), batch_normalizers(ro.completion_mask, max_len=cfg.max_new_tokens))
            return {**met, "grad_norm": 0.0, "skipped_updates": 0}
        if not ro.apply:  # another rank has signal: this one takes part with no rows (zero gradient)
            N = 0
        parts, gnorms, skipped = [], [], 0
        offset, total = distributed.row_offsets(N, w)  # this rank's rows are [offset, offset + N) of the global batch
        for epoch in range(cfg.mu):
            order = torch.randperm(total, generator=step_generator(cfg.seed, step, salt=1 + epoch)) \
                if cfg.minibatches > 1 else torch.arange(total)
            # equal splits of the global batch (dynamic sampling keeps a varying number of rows: then as equal as
            # possible); each rank works on its own rows of each global minibatch, so the minibatches (and their
            # gradients) are those of one process, and every rank runs every split
            for split in (r for r in torch.tensor_split(order, cfg.minibatches) if len(r)):
                rows = split[(split >= offset) & (split < offset + N)] - offset
                norms = self._global_normalizers(ro.completion_mask[rows])
                mb_parts = []
                for micro in (m for m in torch.tensor_split(rows, cfg.grad_accum) if len(m)):
                    loss, met = self._micro_loss(ro, micro, norms)
                    loss.backward()
                    mb_parts.append(met)
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
        common.set_lr(self.opt, self.collapse.lr_scale * common.lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio))
        ro = self.rollout(step)
        t1 = time.perf_counter()
        upd = self.update(ro, step)
        metrics = {**ro.metrics, **upd, "time_update": time.perf_counter() - t1,
                   "step_time": time.perf_counter() - t0, "beta": self.kl_ctl.value}
        # under torchrun: rank means, so that the KL controller, the alarms and the collapse guard decide alike
        metrics = distributed.mean_metrics(metrics, self.world)
        if "kl" in upd:
            self.kl_ctl.update(upd["kl"], 1)
        self.snapshot = watch_step(step + 1, metrics, self.alarms, self.collapse, self.model, self.opt, self.snapshot,
                                   reward=metrics["reward_mean"])
        return metrics

    def run_eval(self):
        r = self.data.evaluate(self.model, self.tokenizer, max_new_tokens=self.cfg.max_new_tokens, keep_samples=5)
        self.model.train()
        return r

    def _state(self, step: int, extra: dict | None = None) -> dict:
        return {"step": step, "trainer": "policy_gradient", "run_id": self.run.run_id, "config": dataclasses.asdict(self.cfg),
                "kl_controller": self.kl_ctl.state_dict(), "alarms": self.alarms.state_dict(), **(extra or {})}

    def save(self, done: int, metrics: dict) -> None:
        """A periodic checkpoint (with the collapse guard's state and snapshot, for an exact resume); rank 0 writes."""
        if not self.world.is_main:
            return
        self.manager.save(done, save_fn=lambda d, **kw: save_with_snapshot(d, self.snapshot, **kw), model=self.model,
                          tokenizer=self.tokenizer, state=self._state(done, {"collapse": self.collapse.state_dict()}),
                          optimizer=self.opt, rng_state=rng_state())

    def finish(self, last_eval, initial, final_step: int, stopped: bool, t_start: float) -> dict:
        """``model/`` (unless the run stopped on non-finite updates), ``summary.json``; a stopped run then fails."""
        cfg = self.cfg
        if last_eval is None:
            last_eval = self.run_eval()
        final = None
        if not stopped:
            if cfg.merge_lora:  # model/ with full weights, no adapter files
                self.model = merge_lora(self.model)
            final = Path(self.out) / "model"
            if self.world.is_main:
                save_checkpoint(final, model=self.model, tokenizer=self.tokenizer,
                                state=self._state(final_step, {"heldout_accuracy": last_eval.accuracy}),
                                optimizer=self.opt, rng_state=rng_state())
            distributed.barrier(self.world)
        summary = {
            "trainer": cfg.algo, "steps": final_step, "stopped_early": stopped,
            "heldout_accuracy": last_eval.accuracy, "heldout_accuracy_start": initial.accuracy if initial else None,
            "heldout_n": last_eval.n, "train_seconds": time.perf_counter() - t_start,
            "alarms": self.alarms.summary(), "restores": self.collapse.restores, "model_dir": str(final) if final else None,
            "samples": last_eval.samples,
        }
        path = common.write_summary(self.out, summary)
        if stopped:  # summary.json says stopped_early; the command fails like SFT/DPO/RM do (exit 2)
            raise TrainingDiverged(self.alarms.nan.stop_message(cfg.algo, final_step, self.out))
        start = f"{initial.accuracy:.3f} -> " if initial else ""
        print(f"held-out accuracy: {start}{last_eval.accuracy:.3f} ({last_eval.correct}/{last_eval.n})")
        print(f"summary: {path}\nmetrics: {Path(self.out) / 'metrics.jsonl'}" + (f"\nmodel:   {final}" if final else ""))
        return summary

    def train(self) -> dict:
        cfg = self.cfg
        print(f"{cfg.algo.upper()}: {len(self.prompts)} training prompts, {cfg.prompts_per_step} x {cfg.num_generations} "
              f"samples/step, model {common.n_params(self.model) / 1e6:.2f}M params, reference model: "
              f"{'yes' if self.ref_model is not None else 'none (beta=0)'}, steps {self.start_step}->{cfg.steps}")
        t_start = time.perf_counter()
        initial = self.run_eval() if self.start_step == 0 else None
        if initial is not None:
            print(f"held-out accuracy at start: {initial.accuracy:.3f}")
            self.logger.log(0, {"heldout_accuracy": initial.accuracy})
        last_eval, stopped, done = None, False, self.start_step
        bar = common.progress_bar(self.start_step, cfg.steps, cfg.algo, cfg.progress)
        for step in bar:
            metrics = self.train_step(step)
            done = step + 1
            if common.should_eval(done, cfg.eval_every, cfg.steps):
                last_eval = self.run_eval()
                metrics["heldout_accuracy"] = last_eval.accuracy
            self.logger.log(done, metrics)
            bar.set_postfix(reward=f"{metrics['reward_mean']:.2f}",
                            **({"acc": f"{last_eval.accuracy:.3f}"} if last_eval else {}))
            if self.alarms.should_stop:
                tqdm.write(f"stopping at step {done}: repeated non-finite updates; last good checkpoint is kept")
                stopped = True
                break
            if common.should_save(done, cfg.save_every, cfg.steps):
                self.save(done, metrics)
        bar.close()
        self.logger.close()
        return self.finish(last_eval, initial, done if stopped else cfg.steps, stopped, t_start)


def train_policy_gradient(cfg: PolicyGradientConfig, resume: str | None = None, overwrite: bool = False) -> dict:
    return PolicyGradientTrainer(cfg, resume=resume, overwrite=overwrite).train()
