"""Rollout engines: where RL samples come from, behind one small interface.

Key insight: the trainer needs from generation only token ids, masks and the log-probs of the distribution the
samples were *actually* drawn from; anything that provides them can generate. Our KV-cache sampler is the
default (:class:`NativeEngine`: its log-probs equal the trainer's exactly, so no correction is needed); a fast
external engine (:class:`~posttrain.engines.vllm.VLLMEngine`) samples from a slightly different distribution,
and the trainer corrects the mismatch with truncated importance sampling
(:func:`posttrain.losses.importance.truncated_is_weights`). :class:`SkewedEngine` samples from a deliberately
different distribution so that the correction can be tested on a CPU.

    engine.generate(prompt_ids, n, sampling, generator, step=None) -> Generation   (rows prompt-major; .logps = the
                                        sampler's; step: the training step, named when the sampler refuses NaN/Inf)
    engine.load_weights(named_tensors)                                  (push the trainer's weights)
    engine.reset_cache()                                                (drop cached prefixes after an update)

The trainers' knobs (``--engine``, ``--tis-cap``, ``--tis-level``) are declared once, by :class:`EngineConfig`,
and taken into each RL config with :func:`engine_knob`; :func:`build_engine` makes the engine a trainer samples
through. An engine whose distribution *is* the trainer's (``matched``: ours) needs no correction, and the
trainers then use IS weights of exactly 1.

Not handled: asynchronous (off-policy by several steps) rollouts, engines on other processes than the trainer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Protocol

import torch

from posttrain.config import check_fields, knob
from posttrain.engines.native import NativeEngine, SkewedEngine
from posttrain.errors import UserError
from posttrain.generate import Generation, SamplingConfig

__all__ = [
    "RolloutEngine",
    "NativeEngine",
    "SkewedEngine",
    "ENGINES",
    "EngineConfig",
    "engine_knob",
    "build_engine",
    "push_weights",
]


class RolloutEngine(Protocol):
    matched: bool  # True: its distribution is the trainer's (IS weights 1); absent counts as False

    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None = None,
        step: int | None = None,
    ) -> Generation: ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def reset_cache(self) -> None: ...


ENGINES = {
    "native": "posttrain.engines.native:NativeEngine",
    "skewed": "posttrain.engines.native:SkewedEngine",
    "vllm": "posttrain.engines.vllm:VLLMEngine",
}
"""Engine name -> where it lives (imported only when chosen: vLLM is an optional, GPU-only extra)."""

VLLM_NEEDS = "engine=vllm needs the vllm extra and a CUDA GPU"


@dataclass
class EngineConfig:
    """The rollout-engine knobs of the RL trainers (each trainer config declares them through :func:`engine_knob`)."""

    engine: str = knob(
        "native",
        "rollout engine: native (posttrain's KV-cache sampler: its log-probs are the "
        "trainer's, IS weights 1) | skewed (samples at 1.3x the temperature: a test engine "
        "whose distribution differs, corrected by truncated IS) | vllm (colocated vLLM; needs "
        "the vllm extra and a CUDA GPU)",
        choices=tuple(ENGINES),
    )
    tis_cap: float = knob(
        2.0,
        "truncated importance sampling cap C: weights min(pi_old / pi_sampler, C) multiply the "
        "per-token policy loss (Yao et al. 2025; TRL's vllm_importance_sampling_cap 2)",
        ge=1,
    )
    tis_level: str = knob(
        "token",
        "truncated IS weight per token, or one per sequence (the product of its tokens' ratios)",
        choices=("token", "sequence"),
    )

    def __post_init__(self):
        check_fields(self)


def engine_knob(name: str):
    """The trainer-config field ``name`` (engine | tis_cap | tis_level), declared by :class:`EngineConfig`."""
    f = next(f for f in dataclasses.fields(EngineConfig) if f.name == name)
    return dataclasses.field(default=f.default, metadata=f.metadata)


def build_engine(cfg, model: torch.nn.Module, tokenizer, model_dir: str | None = None):
    """The engine ``cfg.engine`` names, sampling from ``model`` (ours: the trainer's own module, colocated).

    vllm: a :class:`~posttrain.engines.vllm.VLLMEngine` started on ``model_dir`` (a Hugging Face directory of the
    starting weights); a :class:`UserError` without vLLM or without CUDA."""
    pad, eos = tokenizer.pad_id, tokenizer.eos_id
    if cfg.engine == "native":
        return NativeEngine(model, pad, eos)
    if cfg.engine == "skewed":
        return SkewedEngine(model, pad, eos)
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise UserError(f"{VLLM_NEEDS} (pip install vllm; vLLM is not importable here)") from None
    if not torch.cuda.is_available():
        raise UserError(f"{VLLM_NEEDS} (no CUDA device is visible)")
    if model_dir is None:
        raise UserError(
            "engine=vllm starts vLLM on a Hugging Face model directory: pass --model DIR (or export the "
            "--init checkpoint with `posttrain export --format hf` and pass that)"
        )
    from posttrain.engines.vllm import VLLMEngine

    return VLLMEngine(model_dir, pad_id=pad, eos_id=eos)


def push_weights(engine, model: torch.nn.Module) -> None:
    """The trainer's current weights into ``engine`` (a no-op for ours, which samples from the trainer's own
    tensors), then drop the engine's cached prefixes (they belong to the old weights)."""
    if getattr(engine, "matched", False):
        return
    from posttrain.engines.vllm import VLLMEngine, vllm_named_tensors

    engine.load_weights(vllm_named_tensors(model) if isinstance(engine, VLLMEngine) else model.named_parameters())
    engine.reset_cache()
