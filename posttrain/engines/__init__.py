"""Rollout engines: where RL samples come from, behind one small interface.

Key insight: the trainer needs from generation only token ids, masks and the log-probs of the distribution the
samples were *actually* drawn from; anything that provides them can generate. Our KV-cache sampler is the
default (:class:`NativeEngine`: its log-probs equal the trainer's exactly, so no correction is needed); a fast
external engine (:class:`~posttrain.engines.vllm.VLLMEngine`) samples from a slightly different distribution,
and the trainer corrects the mismatch with truncated importance sampling
(:func:`posttrain.losses.importance.truncated_is_weights`). :class:`SkewedEngine` samples from a deliberately
different distribution so that the correction can be tested on a CPU.

    engine.generate(prompt_ids, n, sampling, generator) -> Generation   (rows prompt-major; .logps = sampler's)
    engine.load_weights(named_tensors)                                  (push the trainer's weights)
    engine.reset_cache()                                                (drop cached prefixes after an update)

Not handled: asynchronous (off-policy by several steps) rollouts, engines on other processes than the trainer.
"""

from __future__ import annotations

from typing import Iterable, Protocol

import torch

from posttrain.engines.native import NativeEngine, SkewedEngine
from posttrain.generate import Generation, SamplingConfig

__all__ = ["RolloutEngine", "NativeEngine", "SkewedEngine", "ENGINES"]


class RolloutEngine(Protocol):
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig,
                 generator: torch.Generator | None = None) -> Generation: ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def reset_cache(self) -> None: ...


ENGINES = {"native": "posttrain.engines.native:NativeEngine", "vllm": "posttrain.engines.vllm:VLLMEngine"}
"""Engine name -> where it lives (imported only when chosen: vLLM is an optional, GPU-only extra)."""
