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

from posttrain.config import check_fields, knob
from posttrain.data.batches import batch_indices
from posttrain.errors import ConfigError, UserError
from posttrain.evaluation import encode_prompt, evaluate
from posttrain.generate import SamplingConfig, decode_completions, generate
from posttrain.losses.advantages import ADVANTAGE_ESTIMATORS
from posttrain.losses.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_controller_from_state,
    kl_penalized_rewards,
)
from posttrain.losses.policy import AGGREGATIONS, batch_normalizers, merge_metrics, policy_loss
from posttrain.losses.policy_objectives import OBJECTIVE_OPTIONS, POLICY_OBJECTIVES
from posttrain.models.gpt import GPT
from posttrain.progress import tqdm  # a bar on a terminal, a line every 10 % in a log
from posttrain.rewards.registry import build_reward, resolve_reward_spec
from posttrain.scoring import completion_logps, prefix_shared_completion_logps
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from posttrain.tasks.arithmetic import verify as exact_verify
from posttrain.trainers import common
from posttrain.trainers.alarms import AlarmConfig, Alarms, CollapseGuard
from posttrain.trainers.checkpoint import (
    POLICY,
    CheckpointManager,
    load_checkpoint,
    load_snapshot,
    restore_rng,
    rng_state,
    save_checkpoint,
    save_with_snapshot,
    take_snapshot,
)
from posttrain.trainers.dynamic_sampling import group_rows, informative_groups, merge_rows, round_generator
from posttrain.trainers.guards import TrainingDiverged, finite_step


@dataclass
class PolicyGradientConfig:
    out: str = knob("runs/grpo", "output directory (metrics.jsonl, summary.json, checkpoints/, model/)")
    init: str | None = knob(None, "SFT checkpoint (or run directory) to start from; required")
    algo: str = knob("grpo", "advantage estimator: reinforce | rloo | grpo", choices=tuple(ADVANTAGE_ESTIMATORS))
    steps: int = knob(700, "optimizer steps (one rollout batch each when mu=1 and minibatches=1)", gt=0)
    prompts_per_step: int = knob(32, "distinct prompts per rollout batch", gt=0)
    num_generations: int = knob(8, "samples per prompt (G)", gt=0)
    max_new_tokens: int = knob(6, "completion length limit in tokens (EOS included)", gt=0)
    temperature: float = knob(1.0, "sampling temperature (the loss uses the same warped distribution)", gt=0)
    top_k: int | None = knob(None, "sampling top-k (None = off)", ge=1)
    top_p: float | None = knob(None, "sampling top-p (None = off)", gt=0, le=1)
    lr: float = knob(3e-4, "learning rate (AdamW, constant after warmup unless min_lr_ratio < 1)", gt=0)
    warmup_steps: int = knob(10, "linear LR warmup steps", ge=0)
    min_lr_ratio: float = knob(1.0, "final LR / peak LR for cosine decay (1 = constant)", ge=0, le=1)
    weight_decay: float = knob(0.0, "AdamW weight decay on matrices", ge=0)
    grad_clip: float = knob(1.0, "max global gradient norm (0 = off)", ge=0)
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
    eval_every: int = knob(50, "steps between greedy held-out evaluations (0 = only at start and end)", ge=0)
    save_every: int = knob(100, "steps between checkpoints (0 = only the final model)", ge=0)
    keep_checkpoints: int = knob(2, "periodic checkpoints to keep", gt=0)
    seed: int = knob(0, "seed for prompt order, sampling and minibatch order", ge=0, lt=2**32)
    logger: str = knob("jsonl", "metrics sink: jsonl | tensorboard", choices=("jsonl", "tensorboard"))
    threads: int | None = knob(1, "torch CPU threads (tiny models run fastest on 1, and never stall on a busy machine; None = torch default)", ge=1)
    progress: bool = knob(True, "show a progress bar")
    task: ArithmeticConfig = knob(factory=ArithmeticConfig, help="embedded task (prompts from its training split)")
    alarms: AlarmConfig = knob(factory=AlarmConfig, help="silent-failure alarms")
    reward_model: str | None = knob(None, "a `posttrain rm` checkpoint scored as the 'reward_model' reward (z-scored with "
                                    "its saved stats; loaded once): alone it makes the reward 'reward_model:1.0', with "
                                    "--reward the spec must name it, e.g. 'reward_model:1.0,format:0.1'")

    def __post_init__(self):
        check_fields(self)  # choices, bounds and finiteness, from the knobs above
        self.reward = resolve_reward_spec(self.reward, self.reward_model, default=type(self).reward)
        if self.algo == "rloo" and self.num_generations < 2:
            raise ConfigError("algo=rloo needs num_generations >= 2")
        n = self.prompts_per_step * self.num_generations
        if n % self.minibatches or (n // self.minibatches) % self.grad_accum:
            raise ConfigError(f"prompts_per_step*num_generations={n} must split evenly into minibatches={self.minibatches} "
                              f"x grad_accum={self.grad_accum}")
        if self.kl_control == "adaptive" and self.beta == 0:
            raise ConfigError("kl_control=adaptive needs beta > 0 (its starting value)")

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                              top_p=self.top_p, num_samples=self.num_generations)


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

# Options each advantage estimator takes from the config: the visible table instead of if/elif on names.
ESTIMATOR_OPTIONS = {
    "grpo": lambda c: {"scale_rewards": c.scale_rewards},
    "rloo": lambda c: {},
    "reinforce": lambda c: {"baseline": c.reinforce_baseline},
}


def step_generator(seed: int, step: int, salt: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 7 + salt)


@dataclass
class Rollout:
    """One rollout batch, everything the update needs (rows prompt-major: G samples per prompt)."""

    sequences: torch.Tensor  # (N, P+T)
    attention_mask: torch.Tensor  # (N, P+T)
    completion_mask: torch.Tensor  # (N, T)
    old_logps: torch.Tensor  # (N, T) sampling-distribution log-probs (pi_old)
    ref_logps: torch.Tensor | None  # (N, T) or None when beta = 0
    advantages: torch.Tensor  # (N,)
    prompt_length: int
    prompt_index: torch.Tensor  # (N,) which prompt each row samples
    metrics: dict
    apply: bool = True  # False: no group had signal; the update only measures (no gradient, no optimizer step)


class PolicyGradientTrainer:
    """Thin loop: rollout -> score -> advantages -> clipped updates. State for exact resume lives here;
    ``__init__`` is the trainer's set-up (the run directory is written only once its inputs are checked)."""

    def __init__(self, cfg: PolicyGradientConfig, resume: str | None = None, overwrite: bool = False):
        if not cfg.init and not resume:
            raise UserError("RL needs a starting policy: pass --init SFT_CHECKPOINT (e.g. the out dir of `posttrain sft`)")
        self.cfg = cfg
        common.set_threads(cfg.threads)
        self.run = common.open_run(cfg, "policy_gradient", resume=resume, overwrite=overwrite)
        self.out = self.run.dir
        self.task = ArithmeticTask(cfg.task)
        self.prompts = self.task.rl_prompts()
        self.evals = self.task.eval_problems()
        self.reward_fn = build_reward(cfg.reward, rm_path=cfg.reward_model)
        common.seed_everything(cfg.seed)
        self.start_step = 0
        ckpt = None
        if resume:
            ckpt = load_checkpoint(self.run.resume_from, with_training_state=True, expect_trainer="policy_gradient")
            self.start_step = ckpt.step
            common.check_resume_step(ckpt.path, self.start_step, cfg.steps)
        init = load_checkpoint(cfg.init, accept_kinds=POLICY, role="grpo --init") if cfg.init else None
        src = ckpt or init
        self.model, self.tokenizer = src.model, src.tokenizer
        self.model.train()
        # the reference is the *initial* policy: from --init, or from the resumed run's own init
        self.ref_model = None
        if cfg.beta > 0:
            ref_src = init.model if init is not None else load_checkpoint(ckpt.state["config"]["init"], accept_kinds=POLICY).model
            self.ref_model = common.frozen(copy.deepcopy(ref_src))  # a frozen copy of the starting policy
        self.kl_ctl = (AdaptiveKLController(cfg.beta, cfg.kl_target, cfg.kl_horizon) if cfg.kl_control == "adaptive"
                       else FixedKLController(cfg.beta))
        self.alarms = Alarms(cfg.alarms)
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
        if max_len is not None and self.task.max_prompt_len + 1 + cfg.max_new_tokens > max_len:
            raise UserError(f"prompt + {cfg.max_new_tokens} new tokens exceed model.max_seq_len={max_len}")
        common.begin_run(self.run, cfg)
        self.logger = common.MetricsLogger(self.out, cfg.logger, resume_step=self.start_step if resume else None)
        self.manager = CheckpointManager(self.out, keep=cfg.keep_checkpoints)

    # ------------------------------------------------------------------------------------------ rollout
    def _draw(self, step: int, rnd: int):
        """Round ``rnd`` of step ``step``: prompts, samples, rewards. Round 0 is the classic batch."""
        cfg = self.cfg
        idx = batch_indices(len(self.prompts), cfg.prompts_per_step, step, cfg.seed + 17 + rnd * 2**32)
        problems = [self.prompts[i] for i in idx.tolist()]
        gen = generate(self.model, [encode_prompt(self.tokenizer, p.prompt) for p in problems],
                       pad_id=self.tokenizer.pad_id, eos_id=self.tokenizer.eos_id, cfg=cfg.sampling,
                       generator=step_generator(cfg.seed, step) if rnd == 0 else round_generator(cfg.seed, step, rnd))
        texts = decode_completions(self.tokenizer, gen)
        G = cfg.num_generations
        prompts = [p.prompt for p in problems for _ in range(G)]
        answers = [p.answer for p in problems for _ in range(G)]
        rewards = torch.tensor(self.reward_fn(prompts, texts, answer=answers), dtype=torch.float32)  # (N,)
        if not torch.isfinite(rewards).all():
            raise UserError("the reward function returned NaN/Inf; rewards must be finite floats")
        correct = torch.tensor([exact_verify(c, a) for c, a in zip(texts, answers)], dtype=torch.float32)
        return gen, rewards, correct

    def rollout(self, step: int) -> Rollout:
        cfg = self.cfg
        G = cfg.num_generations
        t0 = time.perf_counter()
        gen, rewards, correct = first = self._draw(step, 0)
        sel = torch.arange(len(rewards))
        parts, kept, drawn = [(gen, sel)], [rewards], cfg.prompts_per_step
        if cfg.dynamic_sampling:  # DAPO: keep only groups with signal, draw more rounds to refill
            parts, kept, n_kept, rnd = [], [], 0, 0
            while True:
                ok = informative_groups(rewards, G).nonzero().squeeze(1)[: cfg.prompts_per_step - n_kept]
                if len(ok):
                    rows = group_rows(ok, G)
                    parts.append((gen, rows))
                    kept.append(rewards[rows])
                    n_kept += len(ok)
                rnd += 1
                if n_kept >= cfg.prompts_per_step or rnd >= cfg.max_sample_rounds:
                    break
                gen, rewards, _ = self._draw(step, rnd)
                drawn += cfg.prompts_per_step
        t1 = time.perf_counter()
        gen, rewards, correct = first  # the round-0 batch: an unfiltered measure of the policy
        if len(parts) == 1 and len(parts[0][1]) == len(rewards):
            batch = {"sequences": gen.sequences, "attention_mask": gen.attention_mask, "completion_mask": gen.completion_mask,
                     "logps": gen.logps, "prompt_length": gen.prompt_length, "prompt_index": gen.prompt_index}
        elif parts:
            batch = merge_rows(parts, self.tokenizer.pad_id, G)
        else:  # no group with signal in any round: the step makes no update
            batch = None
        apply, groups_kept = batch is not None, sum(len(k) for k in kept) // G
        if batch is None:  # measured on round 0 (the one vocabulary of metrics), not applied
            batch = {"sequences": gen.sequences, "attention_mask": gen.attention_mask, "completion_mask": gen.completion_mask,
                     "logps": gen.logps, "prompt_length": gen.prompt_length, "prompt_index": gen.prompt_index}
            kept = [rewards]
        t2 = time.perf_counter()
        ref_logps = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref_logps = completion_logps(self.ref_model, batch["sequences"], batch["attention_mask"],
                                             batch["prompt_length"], temperature=cfg.temperature, top_k=cfg.top_k,
                                             top_p=cfg.top_p, completion_mask=batch["completion_mask"])
        lengths = gen.completion_mask.sum(-1).float()
        metrics = {
            "reward_mean": rewards.mean().item(), "reward_std": rewards.std().item() if rewards.numel() > 1 else 0.0,
            "accuracy": correct.mean().item(), "completion_length": lengths.mean().item(),
            "truncated_frac": gen.truncated.float().mean().item(),
            "zero_std_frac": 1.0 - informative_groups(rewards, G).float().mean().item(),
            "time_generate": t1 - t0, "time_score": t2 - t1,
        }
        if cfg.dynamic_sampling:
            metrics.update(groups_drawn=drawn, groups_kept=groups_kept,
                           no_signal_step=int(not apply))
        shaped = torch.cat(kept)
        if ref_logps is not None and cfg.kl_in == "reward":
            shaped = kl_penalized_rewards(shaped, batch["logps"], ref_logps, batch["completion_mask"], self.kl_ctl.value,
                                          cfg.kl_estimator)
        advantages, adv_metrics = ADVANTAGE_ESTIMATORS[cfg.algo](shaped, G, **ESTIMATOR_OPTIONS[cfg.algo](cfg))
        if cfg.dynamic_sampling:
            adv_metrics.pop("zero_std_frac", None)  # of the round-0 batch above (the kept groups have none)
        metrics.update(adv_metrics)
        return Rollout(batch["sequences"], batch["attention_mask"], batch["completion_mask"], batch["logps"], ref_logps,
                       advantages, batch["prompt_length"], batch["prompt_index"], metrics, apply)

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
        )

    def update(self, ro: Rollout, step: int) -> dict:
        cfg = self.cfg
        N = ro.sequences.shape[0]
        if not ro.apply:  # dynamic sampling found no group with signal: measure only (no Adam momentum step)
            with torch.no_grad():
                _, met = self._micro_loss(ro, torch.arange(N), batch_normalizers(ro.completion_mask, max_len=cfg.max_new_tokens))
            return {**met, "grad_norm": 0.0, "skipped_updates": 0}
        parts, gnorms, skipped = [], [], 0
        for epoch in range(cfg.mu):
            order = torch.randperm(N, generator=step_generator(cfg.seed, step, salt=1 + epoch)) if cfg.minibatches > 1 \
                else torch.arange(N)
            # equal splits (dynamic sampling keeps a varying number of rows: then as equal as possible)
            for rows in (r for r in torch.tensor_split(order, cfg.minibatches) if len(r)):
                norms = batch_normalizers(ro.completion_mask[rows], max_len=cfg.max_new_tokens)
                mb_parts = []
                for micro in (m for m in torch.tensor_split(rows, cfg.grad_accum) if len(m)):
                    loss, met = self._micro_loss(ro, micro, norms)
                    loss.backward()
                    mb_parts.append(met)
                gnorm = common.grad_norm_and_clip(self.model, cfg.grad_clip)
                met = merge_metrics(mb_parts)
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
        if "kl" in upd:
            self.kl_ctl.update(upd["kl"], 1)
        warnings = self.alarms.update(step + 1, metrics)
        action = self.collapse.update(step + 1, metrics["reward_mean"])
        if action == "snapshot":
            self.snapshot = take_snapshot(self.model, self.opt)
        elif action in ("restore", "warn"):
            if action == "restore" and self.snapshot is not None:
                self.model.load_state_dict(self.snapshot["model"])
                self.opt.load_state_dict(copy.deepcopy(self.snapshot["optimizer"]))
                metrics["restored_from"] = self.collapse.best_step
            warnings.append(self.collapse.message(step + 1, action))
        metrics["restores"] = self.collapse.restores
        for w in warnings:
            tqdm.write(f"ALARM step {step + 1}: {w}")
        if warnings:
            metrics["alarms"] = warnings
        return metrics

    def run_eval(self):
        r = evaluate(self.model, self.tokenizer, [p.prompt for p in self.evals], [p.answer for p in self.evals],
                     max_new_tokens=self.cfg.max_new_tokens, keep_samples=5)
        self.model.train()
        return r

    def _state(self, step: int, extra: dict | None = None) -> dict:
        return {"step": step, "trainer": "policy_gradient", "run_id": self.run.run_id, "config": dataclasses.asdict(self.cfg),
                "kl_controller": self.kl_ctl.state_dict(), "alarms": self.alarms.state_dict(), **(extra or {})}

    def save(self, done: int, metrics: dict) -> None:
        """A periodic checkpoint (with the collapse guard's state and snapshot, for an exact resume)."""
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
            final = save_checkpoint(Path(self.out) / "model", model=self.model, tokenizer=self.tokenizer,
                                    state=self._state(final_step, {"heldout_accuracy": last_eval.accuracy}),
                                    optimizer=self.opt, rng_state=rng_state())
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
