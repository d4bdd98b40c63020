"""PPO's configuration and presets (a2c, kl_ppo, ziegler), each option declared once with its source in the
literature (``knob``); the loop is ``trainers/ppo.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.config import Preset, check_fields, knob
from posttrain.data.conversations import BAD_LINE_HELP, CHAT_TEMPLATE_HELP
from posttrain.engines import engine_knob
from posttrain.errors import ConfigError
from posttrain.generate import SamplingConfig
from posttrain.losses.kl import KL_ESTIMATORS
from posttrain.models.loading import model_path_knob, pad_token_knob
from posttrain.models.lora import lora_knob
from posttrain.rewards.registry import parse_reward_spec
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.tasks.base import USER_FIELDS, USER_REWARD
from posttrain.trainers.alarms import AlarmConfig
from posttrain.trainers.trainer_config import TrainerConfig, override

DEFAULT_REWARD = "exact_match:1.0,digits:0.5"


@dataclass
class PPOConfig(TrainerConfig):
    out: str = override("out", "runs/ppo")
    init: str | None = knob(None, "SFT checkpoint (or run directory) to start the policy from; required")
    reward_model: str | None = knob(
        None,
        "a `posttrain rm` checkpoint: the reward (z-scored with its saved statistics) "
        "when --reward does not say otherwise, and the critic's initialisation",
    )
    reward: str | None = knob(
        None,
        "weighted reward spec as `posttrain grpo`'s, e.g. 'exact_match:1.0,format:0.1' or "
        "'reward_model:1.0,format:0.1'; None = reward_model:1.0 with --reward-model, else "
        f"{DEFAULT_REWARD} on the embedded task and {USER_REWARD} on --data",
    )
    steps: int = override("steps", 300, "rollout batches (each followed by mu epochs of minibatch updates)")
    prompts_per_step: int = knob(64, "distinct prompts per rollout batch", gt=0)
    num_generations: int = knob(
        4, "samples per prompt (PPO needs no groups; more samples = more rows per prompt)", gt=0
    )
    max_new_tokens: int = knob(6, "completion length limit in tokens (EOS included)", gt=0)
    temperature: float = knob(1.0, "sampling temperature (the loss uses the same warped distribution)", gt=0)
    top_k: int | None = knob(None, "sampling top-k (None = off)", ge=1)
    top_p: float | None = knob(None, "sampling top-p (None = off)", gt=0, le=1)
    lr: float = override("lr", 3e-4, "policy learning rate (AdamW)")
    warmup_steps: int = override("warmup_steps", 10, "linear LR warmup steps (counted after the critic warm-up)")
    critic_lr: float = knob(
        1e-3, "critic learning rate (AdamW; OpenRLHF uses ~18x the actor's, a fresh head needs more)", gt=0
    )
    min_lr_ratio: float = override("min_lr_ratio", 1.0)
    grad_clip: float = override("grad_clip", 1.0, "max gradient norm, policy and critic each (0 = off)")
    value_model: str = knob(
        "separate",
        "critic layout: separate (own backbone) | shared (a value head on the policy's "
        "backbone; the value loss then trains it too)",
        choices=("separate", "shared"),
    )
    value_init: str = knob(
        "auto",
        "critic initialisation: reward_model (its backbone and head: N+ implementation "
        "details, OpenRLHF) | policy (a copy of --init, head at 0) | auto (reward_model when "
        "--value-init-path or --reward-model is given)",
        choices=("auto", "reward_model", "policy"),
    )
    critic_warmup: int = knob(
        0, "steps of value-only updates before the policy moves (the policy samples, is not updated)", ge=0
    )
    policy_objective: str = knob(
        "clip",
        "clip (PPO, Schulman et al. 2017 sec. 3) | kl_penalty (unclipped ratio*A - "
        "beta_old*KL(pi_old||pi), sec. 4) | pg (unclipped ratio*A; A2C with mu=1, "
        "minibatches=1)",
        choices=("clip", "kl_penalty", "pg"),
    )
    clip_eps: float = knob(0.2, "PPO ratio clip epsilon (Schulman et al. 2017)", gt=0, le=1)
    dual_clip: float | None = knob(
        None, "dual clip c > 1: loss of A < 0 tokens capped at -c*A (Ye et al. 2020 use 3)", gt=1
    )
    vf_clip: float | None = knob(
        0.2, "value clip: V_old +- this around the rollout's values (TRL cliprange_value 0.2; None = off)", gt=0
    )
    vf_coef: float = knob(0.1, "value loss coefficient c_v (TRL vf_coef 0.1)", ge=0)
    entropy_coef: float = knob(0.0, "entropy bonus coefficient", ge=0)
    gamma: float = knob(1.0, "discount (1: a completion is one episode; TRL, OpenRLHF)", ge=0, le=1)
    lam: float = knob(0.95, "GAE lambda of the actor's advantages (Schulman et al. 2015; TRL 0.95)", ge=0, le=1)
    critic_lam: float | None = knob(
        None, "decoupled GAE lambda for the critic's returns (VC-PPO, Yuan et al. 2025: 1.0); None = lam", ge=0, le=1
    )
    whiten_advantages: bool = knob(True, "whiten advantages over the batch's real tokens (TRL, OpenRLHF)")
    whiten_rewards: bool = knob(
        False, "scale sequence scores to unit std over the batch, mean kept (TRL whiten_rewards)"
    )
    reward_clip: float | None = knob(
        10.0, "clip sequence scores to +- this (OpenRLHF reward_clip_range 10; None = off)", gt=0
    )
    missing_eos_penalty: float | None = knob(
        None,
        "score of a completion that hit max_new_tokens without EOS, in place "
        "of its reward (TRL missing_eos_penalty; None = off)",
    )
    beta: float = knob(
        0.05,
        "KL penalty coefficient in the reward (TRL kl_coef 0.05; 0 = no reference model); the "
        "initial value with kl_control=adaptive (Ziegler et al. 0.15)",
        ge=0,
    )
    kl_estimator: str = knob(
        "k1", "per-token KL estimator in the reward: k1 (Ziegler et al., TRL) | k2 | k3", choices=tuple(KL_ESTIMATORS)
    )
    kl_control: str = knob(
        "fixed",
        "beta fixed, or adaptive (Ziegler et al. 2019: e = clip(KL/target - 1, +-0.2), "
        "beta <- beta (1 + e n / horizon), n = sequences per batch)",
        choices=("fixed", "adaptive"),
    )
    kl_target: float = knob(
        6.0, "adaptive KL target, in nats per SEQUENCE (sum over its tokens; metric kl_per_seq; Ziegler et al. 6)", gt=0
    )
    kl_horizon: float = knob(10000.0, "adaptive KL horizon, in sequences (Ziegler et al. 10000)", gt=0)
    kl_penalty_beta: float = knob(
        1.0, "policy_objective=kl_penalty: initial beta_old of KL(pi_old||pi) (PPO sec. 4)", gt=0
    )
    kl_penalty_target: float = knob(
        0.01,
        "policy_objective=kl_penalty: target KL(pi_old||pi) per token; beta_old "
        "halves below target/1.5, doubles above 1.5 target (PPO sec. 4)",
        gt=0,
    )
    mu: int = knob(
        2,
        "optimisation epochs over each rollout batch (TRL num_ppo_epochs 4; 2 measured better on the "
        "embedded task, docs/ppo.md)",
        gt=0,
    )
    minibatches: int = knob(
        1,
        "optimizer steps per epoch: the rollout batch is cut into this many minibatches (TRL 1 "
        "per epoch at its default batch; 4 x 4 at lr 3e-4 thrashed here, docs/ppo.md)",
        gt=0,
    )
    grad_accum: int = knob(1, "micro-batches per minibatch (the update is the same for any value)", gt=0)
    target_kl: float | None = knob(
        None,
        "stop the epochs of a rollout when a minibatch's approx-KL(pi_old -> pi) per "
        "token exceeds this (Spinning Up uses 0.01; None = off)",
        gt=0,
    )
    seed: int = override("seed", 0, "seed for prompt order, sampling and minibatch order")
    task: ArithmeticConfig = knob(
        factory=ArithmeticConfig, help="embedded task (prompts from its training split)", unused_with=USER_FIELDS
    )
    alarms: AlarmConfig = knob(factory=AlarmConfig, help="silent-failure alarms")
    share_prompt_prefix: bool = knob(
        True,
        "run each prompt once per forward and share its keys/values across its "
        "samples, for the policy and the critic (exact; posttrain GPT only)",
    )
    data: str | None = knob(
        None,
        "JSONL/Parquet of RL prompts, one per row; every other column goes to the reward "
        "functions by name (default: the embedded task's training prompts)",
    )
    eval_data: str | None = knob(
        None, "held-out prompts (same format) for the greedy held-out accuracy (needed with data)"
    )
    prompt_field: str = knob("prompt", "the data column holding the prompt: a string or a list of messages")
    answer_field: str = knob("answer", "the column the exact_match / digits / math rewards read as the reference")
    chat_template: str = knob("auto", CHAT_TEMPLATE_HELP)
    on_bad_line: str = knob("error", BAD_LINE_HELP, choices=("error", "skip"))
    model_path: str | None = model_path_knob()
    pad_token: str | None = pad_token_knob()
    lora_r: int = lora_knob("r")
    lora_alpha: float = lora_knob("alpha")
    lora_dropout: float = lora_knob("dropout")
    lora_target_modules: tuple[str, ...] = lora_knob("target_modules")
    merge_lora: bool = lora_knob("merge")
    engine: str = engine_knob("engine")
    tis_cap: float = engine_knob("tis_cap")
    tis_level: str = engine_knob("tis_level")
    fsdp: bool = knob(
        False,
        "under torchrun: shard the policy's and the critic's parameters, gradients and optimizer states over the "
        "processes (FSDP2; the frozen reference stays whole on each, rollouts sample from a replica refreshed "
        "each step); checkpoints are then sharded (DCP) and `posttrain export` consolidates them",
    )
    value_init_path: str | None = knob(
        None,
        "a `posttrain rm` checkpoint the critic starts from (value_init reward_model or auto) without being the "
        "reward, e.g. with --reward exact_match; None = --reward-model",
    )

    def __post_init__(self):
        check_fields(self)
        if self.fsdp and (self.lora_r > 0 or self.value_model == "shared"):
            raise ConfigError(
                "fsdp supports value_model=separate without LoRA (lora_r = 0) only; the shared value head and "
                "LoRA are not sharded yet"
            )
        n = self.prompts_per_step * self.num_generations
        if n % self.minibatches or (n // self.minibatches) % self.grad_accum:
            raise ConfigError(
                f"prompts_per_step*num_generations={n} must split evenly into minibatches={self.minibatches} "
                f"x grad_accum={self.grad_accum}"
            )
        if self.kl_control == "adaptive" and self.beta == 0:
            raise ConfigError("kl_control=adaptive needs beta > 0 (its starting value)")
        names = parse_reward_spec(self.reward) if self.reward else {}
        if "reward_model" in names and not self.reward_model:
            raise ConfigError("reward 'reward_model' needs --reward-model RM_CHECKPOINT (a `posttrain rm` output)")
        if self.value_init == "reward_model" and not self.critic_init_path:
            raise ConfigError("value_init=reward_model needs --value-init-path or --reward-model RM_CHECKPOINT")
        if self.value_init == "policy" and self.value_init_path:
            raise ConfigError("value_init_path is an RM for the critic: it contradicts value_init=policy")

    @property
    def reward_spec(self) -> str:
        if self.reward or self.reward_model:
            return self.reward or "reward_model:1.0"
        return USER_REWARD if self.data else DEFAULT_REWARD  # digits' partial credit is the embedded task's

    @property
    def critic_init_path(self) -> str | None:
        """The RM checkpoint the critic starts from when ``critic_source`` is reward_model."""
        return self.value_init_path or self.reward_model

    @property
    def critic_source(self) -> str:
        return (
            "reward_model"
            if self.value_init == "reward_model" or (self.value_init == "auto" and self.critic_init_path)
            else "policy"
        )

    def critic_scale(self, stats) -> tuple[float, float]:
        """(scale, shift) of a critic head copied from the RM at ``critic_init_path`` whose saved statistics are
        ``stats``: ``V = w * (RM - mean) / std``, the units of the reward term ``w * reward_model`` (the RM's score
        z-scored with those statistics) when that RM is the reward, with w its weight in the spec; the z-scored RM
        (w = 1) when it only starts the critic (``--value-init-path``, or weight 0); the raw head without statistics.
        Copying the raw head instead starts the critic tens of units from the returns (seeds 0-2 of the embedded task: values
        -6 to -13 against returns near -0.7), so the first updates' advantages are the critic's error."""
        if stats is None:
            return 1.0, 0.0
        is_reward = self.value_init_path in (None, self.reward_model)
        w = parse_reward_spec(self.reward_spec).get("reward_model", 1.0) if is_reward else 1.0
        w = w or 1.0  # at weight 0 the RM is no part of the reward: it only starts the critic
        std = max(float(stats.std), 1e-8)
        return w / std, -w * float(stats.mean) / std

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            num_samples=self.num_generations,
        )


# What each preset is for (`posttrain ppo --help`, docs/ppo.md).
PRESETS: dict[str, dict] = {
    "tiny": Preset("the default, against the task's verifier: PPO-clip, GAE, a critic copied from the policy"),
    "tiny_rm": Preset(
        "against a trained RM (--reward-model): twice the KL penalty, the LR cosine-decayed to 0.1x, so the policy "
        "stays near the samples the RM was trained on",
        {"beta": 0.1, "min_lr_ratio": 0.1},
    ),
    "a2c": Preset(
        "vanilla actor-critic: one on-policy update per batch (ratio exactly 1), no clip, no value clip",
        {"policy_objective": "pg", "mu": 1, "minibatches": 1, "vf_clip": None},
    ),
    "kl_ppo": Preset(
        "the PPO paper's sec. 4: the unclipped surrogate minus an adaptive KL(pi_old || pi) penalty",
        {"policy_objective": "kl_penalty"},
    ),
    "ziegler": Preset(
        "Ziegler et al. 2019: an adaptive KL-to-reference controller (target 6 nats per sequence, beta 0.15)",
        {"kl_control": "adaptive", "beta": 0.15, "kl_target": 6.0, "kl_horizon": 10000.0},
    ),
}
