"""posttrain's own KV-cache sampler as a rollout engine, and a deliberately skewed twin for testing corrections.

:class:`NativeEngine` samples from the model object it is given, usually the trainer's own policy (colocated:
``load_weights`` then has nothing to copy), so its ``logps`` are those the trainer recomputes (tested to
float precision) and truncated importance sampling weights are exactly 1.

:class:`SkewedEngine` samples at ``temperature * skew`` but is asked for ``temperature``: it stands in for an
engine whose kernels or precision make its distribution differ from the trainer's, and reports the log-probs
of the distribution it really sampled from, as vLLM does.

Not handled: a separate copy of the model per engine on another device (``load_weights`` copies into whatever
model it holds; placement is the caller's).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import torch

from posttrain.generate import Generation, SamplingConfig, generate


class NativeEngine:
    matched = True  # its distribution is the trainer's: the trainers use IS weights of exactly 1

    def __init__(self, model: torch.nn.Module, pad_id: int, eos_id: int | None):
        self.model, self.pad_id, self.eos_id = model, pad_id, eos_id

    def sampling_for(self, sampling: SamplingConfig, n: int) -> SamplingConfig:
        return dataclasses.replace(sampling, num_samples=n)

    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None = None,
        step: int | None = None,
    ) -> Generation:
        """``step`` (the training step) is named in the one-line error for NaN/Inf logits."""
        return generate(
            self.model,
            prompt_ids,
            pad_id=self.pad_id,
            eos_id=self.eos_id,
            cfg=self.sampling_for(sampling, n),
            generator=generator,
            step=step,
        )

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the trainer's weights in (every parameter named, shapes equal); a no-op for the trainer's own tensors."""
        own = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, t in named_tensors:
                if name not in own:
                    raise KeyError(f"engine model has no parameter {name!r}")
                if own[name].data_ptr() != t.data_ptr():
                    own[name].copy_(t)

    def reset_cache(self) -> None:
        """Nothing is cached between calls (each ``generate`` builds and drops its own KV cache)."""


class SkewedEngine(NativeEngine):
    matched = False

    def __init__(self, model: torch.nn.Module, pad_id: int, eos_id: int | None, skew: float = 1.3):
        super().__init__(model, pad_id, eos_id)
        if not skew > 0:
            raise ValueError(f"skew must be > 0, got {skew}")
        self.skew = skew

    def sampling_for(self, sampling: SamplingConfig, n: int) -> SamplingConfig:
        return dataclasses.replace(sampling, num_samples=n, temperature=sampling.temperature * self.skew)
