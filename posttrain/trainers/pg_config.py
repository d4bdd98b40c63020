"""The policy-gradient trainer's configuration (REINFORCE, RLOO, GRPO and their DAPO / Dr. GRPO / GSPO options)
and its presets: one declaration per option (``knob``), the CLI flags generated from it; the loop is
``trainers/policy_gradient.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.config import Preset, check_fields, knob
from posttrain.data.conversations import BAD_LINE_HELP, CHAT_TEMPLATE_HELP
from posttrain.engines import engine_knob
from posttrain.errors import ConfigError
from posttrain.generate import SamplingConfig
from posttrain.losses.advantages import ADVANTAGE_ESTIMATORS
from posttrain.losses.kl import KL_ESTIMATORS
from posttrain.losses.policy import AGGREGATIONS
from posttrain.losses.policy_objectives import POLICY_OBJECTIVES
from posttrain.models.loading import model_path_knob, pad_token_knob
from posttrain.models.lora import lora_knob
from posttrain.rewards.registry import parse_reward_spec, resolve_reward_spec
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.tasks.base import USER_FIELDS, USER_REWARD
from posttrain.trainers.alarms import AlarmConfig
from posttrain.trainers.trainer_config import TrainerConfig, override


@dataclass
class PolicyGradientConfig(TrainerConfig):
    out: str = override("out", "runs/grpo")
    init: str | None = knob(None, "SFT checkpoint (or run directory) to start from; required")
    algo: str = knob("grpo", "advantage estimator: reinforce | rloo | grpo", choices=tuple(ADVANTAGE_ESTIMATORS))
    steps: int = override(
        "steps",
        500,
        "optimizer steps (one rollout batch each when mu=1 and minibatches=1; 500: chosen on a 5-seed sweep, "
        "docs/outcomes.md)",
    )
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
    clip_eps_high: float | None = knob(
        None, "PPO clip: ratio <= 1 + clip_eps_high (None = clip_eps_low; DAPO uses 0.28)", ge=0
    )
    dual_clip: float | None = knob(None, "dual clip constant c > 1 for negative advantages (None = off)", gt=1)
    ratio_level: str = knob(
        "token", "importance ratio per token, or per sequence (GSPO)", choices=("token", "sequence")
    )
    objective: str = knob(
        "clip",
        "policy objective (TRL loss_type): clip (PPO/GRPO/DAPO/GSPO; LUSPO with loss_agg "
        "seq_mean_token_sum) | cispo (ratio capped at 1 + clip_eps_high) | sapo | vespo",
        choices=tuple(POLICY_OBJECTIVES),
    )
    sapo_temperature_pos: float = knob(1.0, "SAPO gate temperature where A > 0", gt=0)
    sapo_temperature_neg: float = knob(1.05, "SAPO gate temperature where A <= 0", gt=0)
    vespo_k_pos: float = knob(2.0, "VESPO power k where A >= 0", ge=0)
    vespo_lambda_pos: float = knob(3.0, "VESPO decay lambda where A >= 0", gt=0)
    vespo_k_neg: float = knob(3.0, "VESPO power k where A < 0", ge=0)
    vespo_lambda_neg: float = knob(2.0, "VESPO decay lambda where A < 0", gt=0)
    kl_bias_correction: bool = knob(
        False, "KL term times the importance ratio (DeepSeek-V3.2; TRL's use_bias_correction_kl, on by default there)"
    )
    loss_agg: str = knob("seq_mean_token_mean", "loss aggregation", choices=tuple(AGGREGATIONS))
    scale_rewards: str = knob(
        "group", "GRPO std scaling: group | batch | none (Dr. GRPO)", choices=("group", "batch", "none")
    )
    reinforce_baseline: str = knob(
        "batch_mean", "REINFORCE baseline: none | batch_mean", choices=("none", "batch_mean")
    )
    beta: float = knob(0.0, "KL coefficient to the reference (initial) model; 0 = no reference model is built", ge=0)
    kl_estimator: str = knob("k3", "KL estimator: k1 | k2 | k3", choices=tuple(KL_ESTIMATORS))
    kl_in: str = knob("loss", "apply the KL in the loss or fold it into the reward", choices=("loss", "reward"))
    kl_control: str = knob("fixed", "KL coefficient: fixed | adaptive (Ziegler et al.)", choices=("fixed", "adaptive"))
    kl_target: float = knob(0.05, "adaptive KL: target KL per token (nats)", gt=0)
    kl_horizon: float = knob(1000.0, "adaptive KL: horizon (in steps)", gt=0)
    entropy_coef: float = knob(0.0, "entropy bonus coefficient", ge=0)
    dynamic_sampling: bool = knob(
        True,
        "DAPO dynamic sampling: train only on groups whose rewards are not all equal, "
        "drawing more prompt batches to refill prompts_per_step groups",
    )
    max_sample_rounds: int = knob(
        4, "dynamic sampling: prompt batches drawn per step at most (the first is the usual one)", ge=1
    )
    prompt_filter: bool = knob(
        True,
        "GRESO pre-rollout filtering (trainers/rl/prompt_filter.py): dynamic sampling's refill rounds sample a prompt "
        "with probability prompt_filter_p ** z, z = its rollouts in a row whose rewards were all equal (one "
        "process only; no effect without dynamic_sampling; on by the 5-seed sweep of docs/outcomes.md)",
    )
    prompt_filter_p: float = knob(0.5, "prompt_filter: the factor p of P(sample) = p ** z", gt=0, le=1)
    prompt_filter_fill: bool = knob(
        False,
        "prompt_filter: fill a refill round with skipped prompts when fewer than prompts_per_step pass (off: chosen "
        "on a 5-seed sweep, docs/outcomes.md: the round is only the prompts that passed, fewer samples once most are solved)",
    )
    prompt_filter_pool: int = knob(
        4, "prompt_filter: candidates looked at per refill round, in multiples of prompts_per_step", ge=1
    )
    retry_temperature: float | None = knob(
        None,
        "dynamic sampling: draw the prompts of round 0 whose G samples all failed alike (equal rewards, none correct) "
        "once more at this temperature, above --temperature; their rows are off-policy and weighted by truncated IS "
        "min(pi / pi_hot, tis_cap) (None = off)",
        gt=0,
    )
    retry_is: bool = knob(
        True,
        "retry_temperature: weight the retry's rows by truncated IS against pi_old (on: the gradient stays the "
        "policy's own at --temperature, as small as the rare right answer's probability; off: weight 1, the hot "
        "draw trained on as if drawn from the policy -- biased, a guide that lets a rare right answer teach)",
    )
    share_prompt_prefix: bool = knob(
        True,
        "run each prompt once per update and share its keys/values across its G "
        "samples (exact; posttrain GPT only, HF models use a full forward)",
    )
    reward: str = knob(
        "exact_match:1.0,digits:0.5",
        "weighted reward spec, e.g. 'exact_match:1.0,format:0.1'; the default adds partial credit for digits right "
        f"on the embedded task (docs/outcomes.md); on --data it is {USER_REWARD}",
    )
    seed: int = override("seed", 0, "seed for prompt order, sampling and minibatch order")
    task: ArithmeticConfig = knob(
        factory=ArithmeticConfig, help="embedded task (prompts from its training split)", unused_with=USER_FIELDS
    )
    alarms: AlarmConfig = knob(factory=AlarmConfig, help="silent-failure alarms")
    data: str | None = knob(
        None,
        "JSONL/Parquet of RL prompts, one per row; every other column goes to the reward "
        "functions by name (default: the embedded task; docs/your_data.md)",
    )
    eval_data: str | None = knob(
        None, "held-out prompts (same format) for the greedy held-out accuracy (needed with data)"
    )
    prompt_field: str = knob("prompt", "the data column holding the prompt: a string or a list of messages")
    answer_field: str = knob("answer", "the column the exact_match / digits / math rewards read as the reference")
    chat_template: str = knob("auto", CHAT_TEMPLATE_HELP)
    on_bad_line: str = knob("error", BAD_LINE_HELP, choices=("error", "skip"))
    reward_anneal: str = knob(
        "",
        "comma-separated reward terms (of --reward) whose weight falls linearly to 0 "
        "from step reward_anneal_start*steps to the end, e.g. 'digits' (shaping that "
        "helps early and costs late); the logged reward_mean stays the full spec's",
    )
    reward_anneal_start: float = knob(
        0.5, "fraction of the steps after which the reward_anneal terms start to fall", ge=0, lt=1
    )
    reward_model: str | None = knob(
        None,
        "a `posttrain rm` checkpoint scored as the 'reward_model' reward (z-scored with "
        "its saved stats; loaded once): alone it makes the reward 'reward_model:1.0', with "
        "--reward the spec must name it, e.g. 'reward_model:1.0,format:0.1'",
    )

    def __post_init__(self):
        check_fields(self)  # choices, bounds and finiteness, from the knobs above
        if self.data and self.reward == type(self).reward:  # digits' partial credit is the embedded task's
            self.reward = USER_REWARD
        self.reward = resolve_reward_spec(self.reward, self.reward_model, default=type(self).reward)
        unknown = sorted(set(self.anneal_names) - set(parse_reward_spec(self.reward)))
        if unknown:
            raise ConfigError(
                f"reward_anneal={self.reward_anneal!r}: {', '.join(unknown)} not in reward={self.reward!r}"
            )
        if self.algo == "rloo" and self.num_generations < 2:
            raise ConfigError("algo=rloo needs num_generations >= 2")
        n = self.prompts_per_step * self.num_generations
        if n % self.minibatches or (n // self.minibatches) % self.grad_accum:
            raise ConfigError(
                f"prompts_per_step*num_generations={n} must split evenly into minibatches={self.minibatches} "
                f"x grad_accum={self.grad_accum}"
            )
        if self.retry_temperature is not None and not self.dynamic_sampling:
            raise ConfigError("retry_temperature needs dynamic_sampling (the retry's groups refill its batch)")
        if self.kl_control == "adaptive" and self.beta == 0:
            raise ConfigError("kl_control=adaptive needs beta > 0 (its starting value)")
        if self.fsdp and self.lora_r > 0:
            raise ConfigError("fsdp with LoRA (lora_r > 0) is not supported yet; LoRA alone usually fits one device")

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
        return SamplingConfig(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            num_samples=self.num_generations,
        )

    # a local Hugging Face model (or posttrain checkpoint) to start from, and LoRA (models/loading.py, models/lora.py)
    model_path: str | None = model_path_knob()
    pad_token: str | None = pad_token_knob()
    lora_r: int = lora_knob("r")
    lora_alpha: float = lora_knob("alpha")
    lora_dropout: float = lora_knob("dropout")
    lora_target_modules: tuple[str, ...] = lora_knob("target_modules")
    merge_lora: bool = lora_knob("merge")
    engine: str = engine_knob(
        "engine"
    )  # rollout engine and truncated IS (posttrain/engines/, trainers/rl/rollout_engine.py)
    tis_cap: float = engine_knob("tis_cap")
    tis_level: str = engine_knob("tis_level")
    fsdp: bool = knob(
        False,
        "under torchrun: shard the policy's parameters, gradients and optimizer state over the processes (FSDP2; "
        "the frozen reference stays whole on each, rollouts sample from a replica refreshed each step); "
        "checkpoints are then sharded (DCP) and `posttrain export` consolidates them",
    )
    average_last: int = knob(
        3,
        "final model = the mean of the policy's weights at this many steps, average_every apart, ending at the "
        "last step (tail averaging, trainers/weight_average.py; 1 = the last weights; 3 by the 5-seed sweep of "
        "docs/outcomes.md)",
        ge=1,
    )
    average_every: int = knob(100, "steps between the averaged weights (with average_last > 1)", ge=1)


# What each preset is for (`posttrain grpo --help`, docs/rl.md); the recipes they replaced are in docs/log/.
PRESETS: dict[str, dict] = {
    "tiny": Preset(
        "the default: GRPO, 500 steps at LR 1.5e-4 (chosen on dev over 5 seeds on addition and on Collatz), the final "
        "model the mean of the weights at steps 300/400/500",
        {"lr": 1.5e-4},
    ),
    "tiny_1000": Preset(
        "the default run twice as long: 1000 steps at LR 1.5e-4, the final model the mean of the weights at steps "
        "800/900/1000 (chosen on dev over 5 seeds against the default's 500 on addition and on Collatz, "
        "+1.0 and +1.8 points; 1.4-1.5x its CPU)",
        {"lr": 1.5e-4, "steps": 1000},
    ),
    "long_cosine": Preset(
        "after `sft --preset slots16` (the strongest measured recipe): 1000 steps, the LR cosine-decayed to 0.1x",
        {"steps": 1000, "min_lr_ratio": 0.1},
    ),
    "rloo": Preset(
        "RLOO: each sample's baseline the mean of the other samples of its prompt (unbiased)", {"algo": "rloo"}
    ),
    "reinforce": Preset(
        "REINFORCE: the reward minus the batch mean as the advantage, no groups (Williams 1992)", {"algo": "reinforce"}
    ),
    "dapo": Preset(
        "DAPO: clip-higher (0.28) and token-mean loss, against entropy collapse on long answers",
        {"clip_eps_high": 0.28, "loss_agg": "token_mean"},
    ),
    "dr_grpo": Preset(
        "Dr. GRPO: no std scaling, constant length normaliser (no length or difficulty bias)",
        {"scale_rewards": "none", "loss_agg": "seq_mean_token_sum_norm"},
    ),
    "cispo": Preset(
        "CISPO (MiniMax-M1): the clipped, detached IS weight times log-prob, every token keeps a gradient",
        {"objective": "cispo", "clip_eps_high": 4.0, "loss_agg": "token_mean"},
    ),
    "sapo": Preset(
        "SAPO: a soft sigmoid gate instead of the hard clip, a temperature per advantage sign", {"objective": "sapo"}
    ),
    "luspo": Preset(
        "LUSPO: sequence-level ratios (GSPO) with each sequence's loss times its length",
        {"ratio_level": "sequence", "loss_agg": "seq_mean_token_sum"},
    ),
    "vespo": Preset(
        "VESPO: a smooth gate on the sequence's importance weight, token-mean loss",
        {"objective": "vespo", "loss_agg": "token_mean"},
    ),
}
