"""The pipeline's stages, each a small declared unit: name, config, inputs, dependencies, run function, schema.

    dedup -> tokenizer -> sft (-> sft_raw) -> rm, dpo, grpo, ppo (each from the SFT checkpoint) -> eval -> report

A :class:`Stage` says what its key is made of (``config(ctx)``: the resolved config object; ``inputs(ctx)``:
the files whose bytes it reads; ``deps``: the stages whose keys are chained into its own) and what it
produces (``run(ctx, cfg, out, resume) -> summary``, whose keys ``schema`` declares: the report's section of
the stage is built from it, and a test fails when a declared key is missing). ``available()`` returns why a
stage cannot run in this build, or None.

Adding a stage is one :class:`Stage` in :data:`STAGES`; a trainer stage is :func:`trainer_stage` with the
trainer's config class and its ``train_*`` function (``resume=`` makes it resumable).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from pathlib import Path

from posttrain.pipeline import data_stages, evaluate, report
from posttrain.pipeline.base import POLICY_STAGES, TRAINED, Context, Metric, Stage, get  # noqa: F401 (re-exported)
from posttrain.trainers.engine.registry import TRAINERS

# ---------------------------------------------------------------------------------------------
# dedup and tokenizer (their bodies live in data_stages.py)


def _dedup_config(ctx):
    return data_stages.dedup_key_config(ctx.cfg)


def _dedup_inputs(ctx):
    c = ctx.cfg
    return {k: v for k, v in (("corpus_file", c.corpus_file), ("eval_file", c.eval_file)) if v}


def _run_dedup(ctx, cfg, out, resume):
    return data_stages.run_dedup(ctx, out)


def _run_tokenizer(ctx, cfg, out, resume):
    return data_stages.run_tokenizer(ctx, out)


def _tokenizer_config(ctx):
    if ctx.cfg.hf_model:
        return {"kind": "hf_model", "pad_token": ctx.cfg.pad_token}
    return ctx.cfg.tokenizer


def _tokenizer_inputs(ctx):
    out = {"corpus": ctx.dir("dedup") / "kept.jsonl"}
    if ctx.cfg.hf_model:
        from posttrain.models.loading import TOKENIZER_FILES

        out.update({f"hf_model.{f}": Path(ctx.cfg.hf_model) / f for f in TOKENIZER_FILES})  # missing ones drop out
    return out


# ---------------------------------------------------------------------------------------------
# trainer stages


def _owned(ctx, stage: str, base, **fixed):
    """A trainer config with what the pipeline owns filled in (out, seed, threads, device, dtype, progress, task, ...)."""
    cfg = ctx.cfg
    values = {"out": str(ctx.dir(stage)), "seed": cfg.seed, "threads": cfg.threads, "progress": not ctx.quiet}
    values.update(device=cfg.device, dtype=cfg.dtype, **fixed)
    names = {f.name for f in dataclasses.fields(base)}
    if "task" in names:
        values["task"] = cfg.task
    return dataclasses.replace(base, **{k: v for k, v in values.items() if k in names})


def _tokenizer_path(ctx) -> str | None:
    if ctx.cfg.hf_model or ctx.cfg.tokenizer.kind == "char":
        return None  # hf_model: the model's own tokenizer; char: the task's (the SFT trainer's default)
    return str(ctx.dir("tokenizer") / "tokenizer.json")


def _eval_file(ctx) -> str | None:
    return str(ctx.dir("dedup") / "eval.jsonl") if ctx.cfg.eval_file else None


def _sft_eval_file(ctx) -> str | None:
    """SFT's held-out file: the user's ``eval_file``, or on the embedded corpus the task's held-out problems (so that
    every kept demonstration is trained on; without it the trainer would hold out a slice of them)."""
    if ctx.cfg.eval_file or not ctx.cfg.corpus_file:
        return str(ctx.dir("dedup") / "eval.jsonl")
    return None


def _hf(ctx) -> dict:
    """With ``hf_model``: SFT starts from it (``model_path``); every stage reads its tokenizer with ``pad_token``."""
    return {"pad_token": ctx.cfg.pad_token} if ctx.cfg.hf_model else {}


def _val_data(ctx) -> str | None:
    """What SFT restarts are ranked on: the user's ``[sft] val_data``, else on the embedded corpus the dedup
    stage's ``val.jsonl`` (training-split problems that are not demonstrations)."""
    if ctx.cfg.sft.val_data or ctx.cfg.corpus_file:
        return ctx.cfg.sft.val_data
    return str(ctx.dir("dedup") / "val.jsonl")


def _sft_config(data_name: str, stage: str):
    def config(ctx):
        start = {"model_path": ctx.cfg.hf_model} if ctx.cfg.hf_model else {}
        return _owned(
            ctx,
            stage,
            ctx.cfg.sft,
            data=str(ctx.dir("dedup") / data_name),
            tokenizer=_tokenizer_path(ctx),
            eval_data=_sft_eval_file(ctx),
            val_data=_val_data(ctx),
            # with --jobs > 1 the stages already share the cores: each one's restarts one at a time
            restart_jobs=1 if getattr(ctx.cfg, "jobs", 1) > 1 else ctx.cfg.sft.restart_jobs,
            **start,
            **_hf(ctx),
        )

    return config


def _sft_inputs(data_name: str):
    def inputs(ctx):
        out = {"data": ctx.dir("dedup") / data_name}
        if _val_data(ctx):
            out["val_data"] = Path(_val_data(ctx))
        if _tokenizer_path(ctx):
            out["tokenizer"] = Path(_tokenizer_path(ctx))
        if _sft_eval_file(ctx):
            out["eval_data"] = Path(_sft_eval_file(ctx))
        if ctx.cfg.hf_model:
            out["hf_model"] = Path(ctx.cfg.hf_model)  # its weights and tokenizer files, by content
        return out

    return inputs


def rl_files(ctx) -> dict:
    """``data`` / ``eval_data`` of the grpo and ppo stages: the user's ``prompts_file`` (else, with a user corpus or
    evaluation file, the kept demonstrations' prompts) and the dedup stage's ``eval.jsonl`` (the held-out prompts
    every stage is evaluated on); {} on the embedded default (the trainers draw from the task's training split)."""
    c = ctx.cfg
    if not (c.prompts_file or c.corpus_file or c.eval_file):
        return {}
    return {
        "data": c.prompts_file or str(ctx.dir("dedup") / "sft.jsonl"),
        "eval_data": str(ctx.dir("dedup") / "eval.jsonl"),
    }


def _user_data(ctx, stage: str) -> dict:
    """What a stage after SFT takes from the pipeline's user-data fields."""
    c = ctx.cfg
    if stage in ("rm", "dpo"):
        out = {"data": c.preference_file} if c.preference_file else {}
        if stage == "rm" and c.preference_file:
            from posttrain.on_policy_pairs import TrainPairsConfig

            out["train_pairs"] = TrainPairsConfig()  # the preset's embedded-pair sampling means nothing for a file
        if stage == "rm" and c.preference_eval_file:
            out["eval_data"] = c.preference_eval_file  # the RM's eval_data is held-out pairs
        if stage == "dpo" and c.eval_file:
            out["eval_data"] = _eval_file(ctx)  # DPO's is {prompt, answer}: greedy held-out accuracy
        return out
    out = rl_files(ctx)
    if c.reward:
        out["reward"] = c.reward
    return out


def _from_sft(stage: str, attr: str, **extra):
    def config(ctx):
        base = getattr(ctx.cfg, attr)
        fixed = {"init": str(ctx.model("sft")), **_user_data(ctx, stage), **_hf(ctx), **extra}
        return _owned(ctx, stage, base, **fixed)

    return config


def _from_sft_inputs(config_fn):
    """The SFT model and the data files the stage's resolved config reads, by content."""

    def inputs(ctx):
        cfg = config_fn(ctx)
        out = {"init": ctx.model("sft")}
        for f in ("data", "eval_data"):
            if getattr(cfg, f, None):
                out[f] = Path(getattr(cfg, f))
        return {**out, **_reward_sources(getattr(cfg, "reward", None))}

    return inputs


def _reward_sources(spec) -> dict:
    """The source files of the Python rewards a spec names, by content (an edited reward re-runs its stages)."""
    if not isinstance(spec, str):
        return {}
    from posttrain.rewards.registry import python_reward_sources

    return {f"reward.{name}": path for name, path in python_reward_sources(spec).items()}


def _train_fn(command: str):
    """A training stage's run: the registry's trainer ``command`` (``trainers/engine/registry.py``)."""
    module, fn = TRAINERS[command].module, TRAINERS[command].train

    def run(ctx, cfg, out, resume):
        if getattr(ctx.cfg, "nproc_per_stage", 1) > 1:  # N processes under torchrun (pipeline/distributed.py)
            from posttrain.pipeline import distributed

            return distributed.run_stage(ctx, module, cfg, out, resume)
        train = getattr(importlib.import_module(module), fn)
        kwargs = {}
        params = inspect.signature(train).parameters
        if resume and "resume" in params:
            kwargs["resume"] = str(out)
        elif out.is_dir() and any(out.iterdir()) and "overwrite" in params:
            kwargs["overwrite"] = True
        return train(cfg, **kwargs)

    run.trainer = (module, fn)  # what a worker process imports to run this stage on its own (--jobs)
    return run


def _no_raw(ctx):
    return None if ctx.cfg.contamination_run else "contamination_run = false"


# ---------------------------------------------------------------------------------------------
# eval and report


def _run_eval(ctx, cfg, out, resume):
    return evaluate.run_eval_stage(ctx, out)


def _eval_config(ctx):
    key = {"eval": ctx.cfg.eval, "task": ctx.cfg.task}
    if ctx.cfg.reward:
        key["reward"] = ctx.cfg.reward  # correctness = its first term
    return key


def _eval_inputs(ctx):
    ins = {f"model.{s}": ctx.model(s) for s in POLICY_STAGES + ("rm",) if s in ctx.done and ctx.model(s).is_dir()}
    if ctx.cfg.eval_file:
        ins["eval_file"] = ctx.dir("dedup") / "eval.jsonl"
    return {**ins, **_reward_sources(ctx.cfg.reward)}


def _run_report(ctx, cfg, out, resume):
    return report.write_report(ctx, out)


_TRAIN_SCHEMA = (
    Metric("heldout_accuracy", "held-out greedy accuracy", "{:.3f}"),
    Metric("steps", "steps"),
    Metric("train_seconds", "train seconds", "{:.1f}"),
)

STAGES: tuple[Stage, ...] = (
    Stage(
        "dedup",
        "Dedup: exact and near duplicates, benchmark contamination",
        (),
        _dedup_config,
        _run_dedup,
        (
            Metric("documents_in", "documents in"),
            Metric("kept", "kept"),
            Metric("removed.exact", "removed: exact"),
            Metric("removed.near", "removed: near"),
            Metric("removed.contamination", "removed: contamination"),
            Metric("lsh.bands", "LSH bands b"),
            Metric("lsh.rows", "LSH rows r"),
            Metric("demos_kept", "demonstrations kept"),
        ),
        inputs=_dedup_inputs,
    ),
    Stage(
        "tokenizer",
        "Tokenizer trained on the deduplicated corpus (byte-level BPE, digits split; with hf_model: the model's own)",
        ("dedup",),
        _tokenizer_config,
        _run_tokenizer,
        (
            Metric("vocab_size", "vocabulary size"),
            Metric("tokens_per_word", "tokens per word", "{:.3f}"),
            Metric("bytes_per_token", "bytes per token (compression)", "{:.3f}"),
            Metric("digits_single_tokens", "every digit one token"),
        ),
        inputs=_tokenizer_inputs,
    ),
    Stage(
        "sft",
        "SFT on the deduplicated demonstrations",
        ("dedup", "tokenizer"),
        _sft_config("sft.jsonl", "sft"),
        _train_fn("sft"),
        _TRAIN_SCHEMA + (Metric("train_demos", "demonstrations"), Metric("params", "parameters")),
        inputs=_sft_inputs("sft.jsonl"),
        resumable=True,
    ),
    Stage(
        "sft_raw",
        "SFT on the raw corpus (duplicates and leaked evaluation items kept)",
        ("dedup", "tokenizer"),
        _sft_config("sft_raw.jsonl", "sft_raw"),
        _train_fn("sft"),
        _TRAIN_SCHEMA + (Metric("train_demos", "demonstrations"),),
        inputs=_sft_inputs("sft_raw.jsonl"),
        resumable=True,
        enabled=_no_raw,
    ),
    Stage(
        "rm",
        "Reward model (Bradley-Terry) on the SFT backbone",
        ("sft",),
        _from_sft("rm", "rm"),
        _train_fn("rm"),
        (
            Metric("heldout_pairwise_accuracy", "held-out pairwise accuracy", "{:.3f}"),
            Metric("train_pairs", "training pairs"),
            Metric("heldout_pairs", "held-out pairs"),
            Metric("train_seconds", "train seconds", "{:.1f}"),
        ),
        inputs=_from_sft_inputs(_from_sft("rm", "rm")),
        resumable=True,
    ),
    Stage(
        "dpo",
        "DPO from the SFT checkpoint on on-policy pairs",
        ("sft",),
        _from_sft("dpo", "dpo"),
        _train_fn("dpo"),
        _TRAIN_SCHEMA + (Metric("loss", "loss"),),
        inputs=_from_sft_inputs(_from_sft("dpo", "dpo")),
        resumable=True,
    ),
    Stage(
        "grpo",
        "GRPO from the SFT checkpoint, rewarded by the verifier",
        ("sft",),
        _from_sft("grpo", "grpo"),
        _train_fn("grpo"),
        _TRAIN_SCHEMA
        + (
            Metric("heldout_accuracy_start", "accuracy at step 0", "{:.3f}"),
            Metric("heldout_accuracy_last_weights", "accuracy of the last weights (before tail averaging)", "{:.3f}"),
            Metric("weight_average_steps", "the final model averages the weights at steps"),
        ),
        inputs=_from_sft_inputs(_from_sft("grpo", "grpo")),
        resumable=True,
    ),
    Stage(
        "ppo",
        "PPO from the SFT checkpoint (value model, GAE)",
        ("sft",),
        _from_sft("ppo", "ppo"),
        _train_fn("ppo"),
        _TRAIN_SCHEMA,
        inputs=_from_sft_inputs(_from_sft("ppo", "ppo")),
        resumable=True,
    ),
    Stage(
        "eval",
        "Evaluation: every checkpoint on the same held-out prompts",
        TRAINED,
        _eval_config,
        _run_eval,
        (Metric("n", "held-out prompts"), Metric("samples", "samples per prompt (k)")),
        inputs=_eval_inputs,
        optional_deps=True,
    ),
    Stage(
        "report",
        "Report",
        ("dedup", "tokenizer") + TRAINED + ("eval",),
        lambda ctx: {"version": 1},
        _run_report,
        (Metric("sections", "sections"),),
        optional_deps=True,
    ),
)
BY_NAME = {s.name: s for s in STAGES}
# The order stages are started in: STAGES' order, with the four stages after SFT longest first (on the tiny preset
# grpo ~200-350 s, ppo ~150-260, rm ~150-190 with its GRM recipe on 16 samples per prompt, dpo ~30-40; grpo before
# rm keeps the lanes as they were), so that with --jobs 2 the lanes are grpo + dpo and ppo + rm: a makespan of
# max(grpo + dpo, ppo + rm), the best split of these four.
RUN_ORDER: tuple[Stage, ...] = tuple(
    BY_NAME[n] for n in ("dedup", "tokenizer", "sft", "sft_raw", "grpo", "ppo", "rm", "dpo", "eval", "report")
)
assert sorted(s.name for s in RUN_ORDER) == sorted(BY_NAME)
