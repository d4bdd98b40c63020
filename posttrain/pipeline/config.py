"""The pipeline's config: one dataclass holding every stage's config, and the ``tiny`` / ``micro`` presets.

Resolution as everywhere (``posttrain.config``): dataclass defaults <- preset <- ``--config FILE`` (TOML or
YAML, sections named after the stages: ``[sft]``, ``[grpo]``, ``[dedup]``...) <- flags. The pipeline then
fills in what it owns in each trainer config: ``out``, ``init``, ``data``, ``tokenizer``, ``seed``,
``threads``, ``device``, ``dtype``, ``progress`` and the shared ``task`` (every stage evaluates on the same
held-out prompts).

Users' own data: ``corpus_file`` (JSONL; records with ``prompt`` and ``answer`` are demonstrations, every
record's ``text`` feeds dedup and the tokenizer), ``eval_file`` (JSONL of {prompt, answer, ...}: the
contamination check, SFT/DPO/GRPO/PPO evaluation and the eval stage), ``prompts_file`` (RL prompts of the grpo
and ppo stages, with the columns the reward reads; default with a user corpus or eval file: the kept
demonstrations' prompts), ``reward`` (the grpo/ppo reward spec, built-in names or ``pkg.module:function``; its
first term decides correctness in the eval stage too), ``preference_file`` (pairs the rm and dpo stages train on
instead of on-policy pairs; ``preference_eval_file`` the rm stage's held-out pairs), ``hf_model`` (a local Hugging Face model directory: SFT starts from it through its
``model_path``, every later stage from that SFT checkpoint, and the tokenizer stage only measures the model's own
tokenizer on the corpus; ``pad_token`` for a tokenizer without one). Each stage's section can still set its own
``data``; the files' bytes (and the model directory's) enter the stage keys, never their paths.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from posttrain.config import Preset, _merge, build_config, check_fields, knob
from posttrain.data.dedup.run import DedupConfig
from posttrain.errors import ConfigError
from posttrain.pipeline.corpus import CorpusConfig
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers.device_config import DeviceConfig, device_field
from posttrain.trainers.dpo_config import PRESETS as DPO_PRESETS
from posttrain.trainers.dpo_config import DPOConfig
from posttrain.trainers.pg_config import PRESETS as GRPO_PRESETS
from posttrain.trainers.pg_config import PolicyGradientConfig
from posttrain.trainers.ppo_config import PRESETS as PPO_PRESETS
from posttrain.trainers.ppo_config import PPOConfig
from posttrain.trainers.reward_config import RECIPE as RM_RECIPE
from posttrain.trainers.reward_config import RMConfig
from posttrain.trainers.sft_config import PRESETS as SFT_PRESETS
from posttrain.trainers.sft_config import SFTConfig


@dataclass
class TokenizerStageConfig:
    kind: str = knob(
        "byte-bpe",
        "byte-bpe (trained on the deduplicated corpus) | char (the task's characters)",
        choices=("byte-bpe", "char"),
    )
    vocab_size: int = knob(512, "vocabulary size including special tokens (byte-bpe: >= 259)", gt=0)
    min_frequency: int = knob(2, "stop merging when the best pair is rarer than this", ge=1)
    individual_digits: bool = knob(
        True,
        "pre-tokenise every digit as its own word (Llama / DeepSeek): numbers are spelled with the same ten tokens",
    )

    def __post_init__(self):
        check_fields(self, "tokenizer.")


@dataclass
class EvalStageConfig:
    samples: int = knob(8, "samples per prompt at temperature 1 (pass@1 over them, pass@k, RM best-of-N)", ge=1)
    temperature: float = knob(1.0, "sampling temperature of the sampled evaluation", gt=0)
    max_new_tokens: int = knob(6, "generation length", gt=0)
    heldout_all: bool = knob(
        True,
        "embedded task: also score every policy greedily on the whole held-out split (1,051 problems, not only "
        "the num_eval sample) and per operand layout ('2+2', '1+2', ...)",
    )

    def __post_init__(self):
        check_fields(self, "eval.")


# near duplicates of the embedded corpus sit at Jaccard 0.78-0.95: a 0.7 threshold catches them with LSH recall
# ~1 while unrelated paragraphs (~0.15) never become candidates
DEDUP_DEFAULTS: dict = {
    "threshold": 0.7,
    "id_field": "id",
    "contamination_field": "text",
    "drop_contaminated": True,
    "workers": 1,
    "progress": False,
}


def _dedup_default() -> DedupConfig:
    return DedupConfig(**DEDUP_DEFAULTS)


def _rm_default() -> RMConfig:
    # the RM recipe cut to the demo's budget (RM_PIPELINE below), not RMConfig's short field defaults
    return build_config(RMConfig, RM_PIPELINE)


def _ppo_default() -> PPOConfig:
    return build_config(PPOConfig, PPO_PIPELINE)


@dataclass
class PipelineConfig:
    seed: int = knob(0, "seed of every stage (outcomes vary by seed: benchmarks/bench_outcomes.py)", ge=0, lt=2**32)
    threads: int = knob(1, "torch CPU threads of every stage", ge=1)
    device: str = device_field("device", "every training stage")
    dtype: str = device_field("dtype", "every training stage, fp16 excepted (rm and ppo do not train in it)")
    jobs: int = knob(
        1,
        "training stages run at once when their inputs are ready (sft_raw beside sft; rm, dpo, grpo "
        "and ppo after sft), each in its own process with its output in OUT/.pipeline/STAGE.log; "
        "results are the same for any value",
        ge=1,
    )
    contamination_run: bool = knob(
        True,
        "also train SFT on the raw corpus (duplicates and leaked eval items kept) "
        "to show what contamination does to held-out accuracy",
    )
    corpus_file: str | None = knob(
        None, "your JSONL corpus instead of the embedded one ({text}; {prompt, answer} records are SFT demonstrations)"
    )
    eval_file: str | None = knob(None, "your JSONL of held-out {prompt, answer} (default: the task's held-out set)")
    prompts_file: str | None = knob(
        None,
        "your JSONL/Parquet of RL prompts for the grpo and ppo stages ({prompt} and "
        "the columns the reward reads, e.g. answer; default with corpus_file or "
        "eval_file: the kept demonstrations' prompts)",
    )
    reward: str | None = knob(
        None,
        "reward spec of the grpo and ppo stages and of the eval stage's correctness "
        "(built-in names or pkg.module:function, weighted; the first term >= 1 is "
        "correct); None = exact match (grpo: its own default spec)",
    )
    preference_file: str | None = knob(
        None,
        "your JSONL of {prompt, chosen, rejected[, margin]} pairs: the rm and "
        "dpo stages train on it instead of pairs sampled from the SFT model",
    )
    preference_eval_file: str | None = knob(
        None,
        "held-out pairs (same format) the rm stage's pairwise accuracy is measured on; needed with preference_file",
    )
    hf_model: str | None = knob(
        None,
        "a local Hugging Face model directory (config.json, *.safetensors, tokenizer "
        "files) instead of the tiny GPT: SFT starts from it, every stage uses its "
        "tokenizer (no tokenizer is trained)",
    )
    pad_token: str | None = knob(None, "with hf_model: the pad token, for a tokenizer that has none")
    corpus: CorpusConfig = knob(factory=CorpusConfig, help="the embedded corpus")
    task: ArithmeticConfig = knob(factory=ArithmeticConfig, help="the embedded task (every stage shares it)")
    dedup: DedupConfig = knob(factory=_dedup_default, help="dedup stage")
    tokenizer: TokenizerStageConfig = knob(factory=TokenizerStageConfig, help="tokenizer stage")
    sft: SFTConfig = knob(factory=SFTConfig, help="SFT stage (and the raw-corpus SFT)")
    rm: RMConfig = knob(
        factory=_rm_default,
        help="reward-model stage (default: `posttrain rm --preset tiny` cut to the demo's 10 minutes)",
    )
    dpo: DPOConfig = knob(factory=DPOConfig, help="DPO stage")
    grpo: PolicyGradientConfig = knob(factory=PolicyGradientConfig, help="GRPO stage")
    ppo: PPOConfig = knob(factory=_ppo_default, help="PPO stage (default: `posttrain ppo --preset tiny` at 200 steps)")
    eval: EvalStageConfig = knob(factory=EvalStageConfig, help="evaluation stage")
    nproc_per_stage: int = knob(
        1,
        "processes per training stage: N > 1 runs each under torchrun (pipeline/distributed.py; "
        "grpo and ppo keys then include N, their sampling streams being per rank)",
        ge=1,
    )

    def __post_init__(self):
        check_fields(self)
        if self.nproc_per_stage > 1 and self.jobs > 1:
            raise ConfigError("nproc_per_stage > 1 runs one training stage at a time on N processes: set jobs = 1")
        if self.nproc_per_stage > 1 and self.sft.restarts > 1:
            raise ConfigError(
                f"nproc_per_stage > 1 runs SFT under torchrun, where restarts are not supported: set "
                f"sft.restarts = 1 (it is {self.sft.restarts})"
            )
        if self.nproc_per_stage > 1 and self.rm.sft_coef > 0:
            raise ConfigError(
                f"nproc_per_stage > 1 runs the rm stage under torchrun, where its GRM term is not supported: set "
                f"rm.sft_coef = 0 (it is {self.rm.sft_coef})"
            )
        if self.hf_model and not Path(self.hf_model).is_dir():
            raise ConfigError(
                f"hf_model={self.hf_model!r}: not a directory (a local Hugging Face model directory, "
                f"as save_pretrained writes it)"
            )
        if bool(self.preference_file) != bool(self.preference_eval_file):
            raise ConfigError(
                "preference_file and preference_eval_file go together: the rm stage trains on the first "
                "and measures held-out pairwise accuracy on the second"
            )
        if self.pad_token and not self.hf_model:
            raise ConfigError("pad_token is for an hf_model's tokenizer; set hf_model or remove pad_token")
        if self.reward:
            default = PolicyGradientConfig.__dataclass_fields__["reward"].default
            for section, spec in (
                ("grpo", self.grpo.reward if self.grpo.reward != default else None),
                ("ppo", self.ppo.reward),
            ):
                if spec is not None and spec != self.reward:
                    raise ConfigError(
                        f"reward={self.reward!r} and {section}.reward={spec!r}: the top-level reward is "
                        f"the grpo and ppo stages' reward; set one of them"
                    )
        for section, name, instead in PIPELINE_OWNED:
            value = getattr(getattr(self, section), name, None)
            if value not in (None, "", ()):
                raise ConfigError(
                    f"{section}.{name}={value!r}: the pipeline sets it ({instead}); a stage option it does not "
                    f"honour is refused, not overridden"
                )
        check_stage_devices(self)
        if self.tokenizer.kind == "byte-bpe" and self.tokenizer.vocab_size < 259:
            raise ConfigError(
                f"tokenizer.vocab_size={self.tokenizer.vocab_size}: byte-bpe needs >= 259 "
                f"(256 bytes + 3 special tokens)"
            )


def check_stage_devices(cfg: PipelineConfig) -> None:
    """The top-level ``device`` and ``dtype`` are every training stage's: a section setting another value is refused
    (not overridden), and fp16 too, which the rm and ppo trainers refuse (``engine/device.py``)."""
    if cfg.dtype == "fp16":
        raise ConfigError("dtype=fp16: the rm and ppo stages do not train in fp16; use dtype=bf16")
    defaults = {name: f.default for name, f in DeviceConfig.__dataclass_fields__.items()}
    for section in ("sft", "rm", "dpo", "grpo", "ppo"):
        stage = getattr(cfg, section)
        for name, default in defaults.items():
            value = stage.get(name, default) if isinstance(stage, dict) else getattr(stage, name)
            if value not in (default, getattr(cfg, name)):
                raise ConfigError(
                    f"{section}.{name}={value!r} and {name}={getattr(cfg, name)!r}: the top-level {name} is every "
                    f"training stage's; set it there"
                )


PIPELINE_OWNED = (
    ("sft", "data", "the deduplicated corpus: pass your demonstrations or conversations as corpus_file"),
    ("sft", "eval_data", "the held-out problems: pass them as eval_file"),
    ("sft", "tokenizer", "the tokenizer stage's, or hf_model's own"),
    ("sft", "model_path", "set hf_model"),
    ("sft", "init", "SFT starts from a fresh model or hf_model"),
    ("rm", "data", "pass your pairs as preference_file"),
    ("rm", "eval_data", "pass held-out pairs as preference_eval_file"),
    ("dpo", "data", "pass your pairs as preference_file"),
    ("dpo", "eval_data", "the held-out problems: pass them as eval_file"),
    ("grpo", "data", "pass your RL prompts as prompts_file"),
    ("grpo", "eval_data", "the held-out problems: pass them as eval_file"),
    ("ppo", "data", "pass your RL prompts as prompts_file"),
    ("ppo", "eval_data", "the held-out problems: pass them as eval_file"),
    *((stage, "init", "the sft stage's model") for stage in ("rm", "dpo", "grpo", "ppo")),
    *((stage, "model_path", "set hf_model") for stage in ("rm", "dpo", "grpo", "ppo")),
)
"""(stage section, field, what to set instead): the fields of a stage's config the pipeline fills in itself."""

_MICRO_MODEL = {"n_layer": 1, "n_head": 2, "d_model": 32, "max_seq_len": 32}
# The `tiny` preset's stages are the trainers' own `tiny` presets, cut where `make demo`'s 10 minutes on two cores
# need it (docs/pipeline.md#presets). The presets carry every stage section, so that a section of a --config file
# changes only the fields it names and keeps the rest of the recipe.
# sft and sft_raw (side by side, the critical path's start): 2 of the recipe's 4 restarts, 2 x 1000 + 1000 = 3000
# steps, what the SFT stage cost before the 2000-step recipe.
SFT_PIPELINE: dict = {**SFT_PRESETS["tiny"], "restarts": 2}
# rm: 800 of the recipe's 3000 steps, on 3000 of its prompts, the training pairs from the 16 samples per prompt of
# the held-out pairs instead of 32 (~30 s of sampling).
RM_PIPELINE: dict = _merge(
    json.loads(json.dumps(RM_RECIPE)),
    {"steps": 800, "pairs": {"num_prompts": 3000}, "train_pairs": {"samples_per_prompt": None}},
)
# ppo: 200 of its 300 steps (a constant LR: the 300-step run's first 200 steps).
PPO_PIPELINE: dict = {**PPO_PRESETS["tiny"], "steps": 200}
# The held-out sample stays 256 problems (the contamination leaks are drawn from it; eval.heldout_all scores every
# policy on the whole held-out split as well).
_TINY: dict = {
    "dedup": DEDUP_DEFAULTS,
    "sft": SFT_PIPELINE,
    "rm": RM_PIPELINE,
    "dpo": DPO_PRESETS["tiny"],
    "grpo": GRPO_PRESETS["tiny"],
    "ppo": PPO_PIPELINE,
    "task": {"num_eval": 256},
}
PRESETS: dict[str, dict] = {
    "tiny": Preset("every trainer's own tiny preset, cut to 10 minutes on two cores: what `make demo` runs", _TINY),
    "micro": Preset(
        "every stage in seconds on one thread: the tests",
        _merge(
            json.loads(json.dumps(_TINY)),
            {
                "corpus": {"paragraphs": 120, "sentences": 3, "exact_dups": 12, "near_dups": 12, "leaks": 8},
                "task": {"num_demos": 48, "num_eval": 32},
                "tokenizer": {"vocab_size": 300},
                "sft": {
                    "steps": 24,
                    "batch_size": 16,
                    "eval_every": 12,
                    "save_every": 8,
                    "warmup_steps": 2,
                    "model": _MICRO_MODEL,
                    "restarts": 2,
                    "restart_probe": 0.5,
                    "restart_keep": 1,
                    "val_problems": 64,
                },
                "rm": {
                    "steps": 6,
                    "batch_size": 8,
                    "eval_every": 0,
                    "save_every": 0,
                    "eval_prompts": 32,
                    "stats_pairs": 32,
                    "pairs": {"num_prompts": 32, "samples_per_prompt": 4, "gold_chosen": True},
                },
                "dpo": {
                    "steps": 6,
                    "batch_size": 8,
                    "eval_every": 0,
                    "save_every": 0,
                    "pairs": {"num_prompts": 32, "samples_per_prompt": 4, "gold_chosen": True},
                },
                "grpo": {
                    "steps": 4,
                    "prompts_per_step": 4,
                    "num_generations": 4,
                    "eval_every": 0,
                    "save_every": 0,
                    "max_sample_rounds": 1,
                },
                "ppo": {"steps": 4, "prompts_per_step": 4, "num_generations": 4, "eval_every": 0, "save_every": 0},
                "eval": {"samples": 4},
            },
        ),
    ),
}
