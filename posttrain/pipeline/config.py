"""The pipeline's config: one dataclass holding every stage's config, and the ``tiny`` / ``micro`` presets.

Resolution as everywhere (``posttrain.config``): dataclass defaults <- preset <- ``--config FILE`` (TOML or
YAML, sections named after the stages: ``[sft]``, ``[grpo]``, ``[dedup]``...) <- flags. The pipeline then
fills in what it owns in each trainer config: ``out``, ``init``, ``data``, ``tokenizer``, ``seed``,
``threads``, ``progress`` and the shared ``task`` (every stage evaluates on the same held-out prompts).

Users' own data: ``corpus_file`` (JSONL; records with ``prompt`` and ``answer`` are demonstrations, every
record's ``text`` feeds dedup and the tokenizer), ``eval_file`` (JSONL of {prompt, answer}: the contamination
check, SFT/DPO evaluation and the eval stage), ``dpo.data`` (a preference file), ``grpo.reward`` (a
reward spec: built-in names or ``pkg.module:function``). ``hf_model`` is declared but not wired yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.config import check_fields, knob
from posttrain.data.dedup.run import DedupConfig
from posttrain.errors import ConfigError
from posttrain.pipeline.corpus import CorpusConfig
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers.dpo import DPOConfig
from posttrain.trainers.policy_gradient import PolicyGradientConfig
from posttrain.trainers.reward import RMConfig
from posttrain.trainers.sft import SFTConfig


@dataclass
class TokenizerStageConfig:
    kind: str = knob("byte-bpe", "byte-bpe (trained on the deduplicated corpus) | char (the task's characters)",
                     choices=("byte-bpe", "char"))
    vocab_size: int = knob(512, "vocabulary size including special tokens (byte-bpe: >= 259)", gt=0)
    min_frequency: int = knob(2, "stop merging when the best pair is rarer than this", ge=1)
    individual_digits: bool = knob(True, "pre-tokenise every digit as its own word (Llama / DeepSeek): numbers "
                                         "are spelled with the same ten tokens")

    def __post_init__(self):
        check_fields(self, "tokenizer.")


@dataclass
class EvalStageConfig:
    samples: int = knob(8, "samples per prompt at temperature 1 (pass@1 over them, pass@k, RM best-of-N)", ge=1)
    temperature: float = knob(1.0, "sampling temperature of the sampled evaluation", gt=0)
    max_new_tokens: int = knob(6, "generation length", gt=0)

    def __post_init__(self):
        check_fields(self, "eval.")


def _dedup_default() -> DedupConfig:
    # near duplicates of the embedded corpus sit at Jaccard 0.78-0.95: a 0.7 threshold catches them with
    # LSH recall ~1 while unrelated paragraphs (~0.15) never become candidates
    return DedupConfig(threshold=0.7, id_field="id", contamination_field="text", drop_contaminated=True,
                       workers=1, progress=False)


@dataclass
class PipelineConfig:
    seed: int = knob(0, "seed of every stage (outcomes vary by seed: benchmarks/bench_outcomes.py)", ge=0, lt=2**32)
    threads: int = knob(1, "torch CPU threads of every stage", ge=1)
    jobs: int = knob(1, "training stages run at once when their inputs are ready (sft_raw beside sft; rm, dpo, grpo "
                        "and ppo after sft), each in its own process with its output in OUT/.pipeline/STAGE.log; "
                        "results are the same for any value", ge=1)
    contamination_run: bool = knob(True, "also train SFT on the raw corpus (duplicates and leaked eval items kept) "
                                         "to show what contamination does to held-out accuracy")
    corpus_file: str | None = knob(None, "your JSONL corpus instead of the embedded one ({text}; {prompt, answer} "
                                         "records are SFT demonstrations)")
    eval_file: str | None = knob(None, "your JSONL of held-out {prompt, answer} (default: the task's held-out set)")
    hf_model: str | None = knob(None, "a Hugging Face model directory instead of the tiny GPT (not yet wired)")
    corpus: CorpusConfig = knob(factory=CorpusConfig, help="the embedded corpus")
    task: ArithmeticConfig = knob(factory=ArithmeticConfig, help="the embedded task (every stage shares it)")
    dedup: DedupConfig = knob(factory=_dedup_default, help="dedup stage")
    tokenizer: TokenizerStageConfig = knob(factory=TokenizerStageConfig, help="tokenizer stage")
    sft: SFTConfig = knob(factory=SFTConfig, help="SFT stage (and the raw-corpus SFT)")
    rm: RMConfig = knob(factory=RMConfig, help="reward-model stage")
    dpo: DPOConfig = knob(factory=DPOConfig, help="DPO stage")
    grpo: PolicyGradientConfig = knob(factory=PolicyGradientConfig, help="GRPO stage")
    ppo: dict = knob(factory=dict, help="PPO stage: PPOConfig fields (posttrain.trainers.ppo), when installed")
    eval: EvalStageConfig = knob(factory=EvalStageConfig, help="evaluation stage")

    def __post_init__(self):
        check_fields(self)
        if self.hf_model:
            raise ConfigError(f"hf_model={self.hf_model!r}: a Hugging Face model in the pipeline is not yet wired "
                              f"(the sft/rm/dpo/grpo stages train the tiny GPT); remove hf_model")
        if self.tokenizer.kind == "byte-bpe" and self.tokenizer.vocab_size < 259:
            raise ConfigError(f"tokenizer.vocab_size={self.tokenizer.vocab_size}: byte-bpe needs >= 259 "
                              f"(256 bytes + 3 special tokens)")


_MICRO_MODEL = {"n_layer": 1, "n_head": 2, "d_model": 32, "max_seq_len": 32}
PRESETS: dict[str, dict] = {
    "tiny": {},  # every trainer's own tiny defaults: what `make demo` runs
    "micro": {  # every stage in seconds on one thread: CI
        "corpus": {"paragraphs": 120, "sentences": 3, "exact_dups": 12, "near_dups": 12, "leaks": 8},
        "task": {"num_demos": 48, "num_eval": 32},
        "tokenizer": {"vocab_size": 300},
        "sft": {"steps": 24, "batch_size": 16, "eval_every": 12, "save_every": 8, "warmup_steps": 2,
                "model": _MICRO_MODEL},
        "rm": {"steps": 6, "batch_size": 8, "eval_every": 0, "save_every": 0, "eval_prompts": 32, "stats_pairs": 32,
               "pairs": {"num_prompts": 32, "samples_per_prompt": 4, "gold_chosen": True}},
        "dpo": {"steps": 6, "batch_size": 8, "eval_every": 0, "save_every": 0,
                "pairs": {"num_prompts": 32, "samples_per_prompt": 4, "gold_chosen": True}},
        "grpo": {"steps": 4, "prompts_per_step": 4, "num_generations": 4, "eval_every": 0, "save_every": 0,
                 "max_sample_rounds": 1},
        "ppo": {"steps": 4, "prompts_per_step": 4, "num_generations": 4, "eval_every": 0, "save_every": 0},
        "eval": {"samples": 4},
    },
}
