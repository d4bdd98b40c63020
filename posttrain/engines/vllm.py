"""vLLM as a colocated rollout engine (optional extra, CUDA only): fast sampling, weights pushed every step.

Key insight: vLLM's paged attention and continuous batching generate many times faster than a training
framework's sampler, but its kernels (and often bf16) make its token probabilities differ slightly from the
trainer's. The trainer keeps its own pi_old (recomputed with the training forward) and corrects the gap with
truncated importance sampling, w = min(pi_old / pi_vllm, C) (:mod:`posttrain.losses.importance`), as TRL and
verl do. After each optimizer step the trainer's weights are pushed in place (``load_weights``), and the
prefix cache is dropped (``reset_cache``) because cached keys/values belong to the old weights.

Parameter names: vLLM's model classes load Hugging Face checkpoint names. A Hugging Face model's own
``named_parameters()`` are those names already; a posttrain GPT is pushed as GPT-2
(:func:`posttrain.models.convert.gpt2_named_tensors`, the layout ``posttrain export --format hf`` writes), so
the engine is started on that exported directory. :func:`vllm_named_tensors` picks the mapping.

Not handled: tensor parallelism inside the engine, a vLLM server on other GPUs (only the colocated
``LLM(...)``), pushing LoRA adapters (merge them first: ``peft``'s ``merge_and_unload``), CPU-only machines
(vLLM needs CUDA: this module can be imported anywhere, the engine built only where vLLM is installed).
"""

from __future__ import annotations

from typing import Iterable

import torch

from posttrain.engines.batching import assemble
from posttrain.errors import UserError
from posttrain.generate import Generation, SamplingConfig


def vllm_named_tensors(model: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """The ``(name, tensor)`` stream vLLM's ``load_weights`` reads for ``model`` (posttrain GPT -> GPT-2 names;
    a Hugging Face model -> its own names, minus a DDP wrapper's ``module.`` prefix)."""
    from posttrain.models.gpt import GPT

    model = getattr(model, "module", model)
    if isinstance(model, GPT):
        from posttrain.models.convert import gpt2_named_tensors

        return list(gpt2_named_tensors(model))
    if any("lora_" in n for n, _ in model.named_parameters()):
        raise UserError("push merged weights to vLLM: call peft's merge_and_unload() (or train without LoRA)")
    return [(n, p) for n, p in model.named_parameters()]


def _vllm():
    try:
        import vllm
    except ImportError:
        raise UserError(
            "the vllm engine needs vLLM on a CUDA machine: pip install vllm (not installable on CPU-only "
            "machines; the default engine is posttrain's own sampler)"
        ) from None
    return vllm


class VLLMEngine:
    """``LLM(model=model_dir)`` in this process, sharing the GPU with the trainer (``gpu_memory_utilization``)."""

    matched = False  # its kernels (and bf16) differ from the trainer's: truncated IS corrects the gap

    def __init__(
        self,
        model_dir: str,
        *,
        pad_id: int,
        eos_id: int | None,
        gpu_memory_utilization: float = 0.3,
        dtype: str = "bfloat16",
        seed: int = 0,
        max_model_len: int | None = None,
    ):
        vllm = _vllm()
        self.pad_id, self.eos_id = pad_id, eos_id
        self.llm = vllm.LLM(
            model=str(model_dir),
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            seed=seed,
            enable_prefix_caching=True,
            max_model_len=max_model_len,
        )
        self._vllm = vllm

    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None = None,
        step: int | None = None,
    ) -> Generation:
        """``generator`` seeds vLLM's sampler (one draw from it), so runs are repeatable for a fixed engine. ``step``
        is accepted for the protocol (vLLM does not check the logits it samples from)."""
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator)) if generator is not None else None
        params = self._vllm.SamplingParams(
            n=n,
            temperature=sampling.temperature,
            top_k=sampling.top_k or -1,
            top_p=sampling.top_p or 1.0,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,
            seed=seed,
            stop_token_ids=[self.eos_id] if self.eos_id is not None else None,
        )
        prompts = [self._vllm.TokensPrompt(prompt_token_ids=p) for p in prompt_ids]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        completions, logps = [], []
        for out in outs:  # one RequestOutput per prompt, n CompletionOutputs each: prompt-major, as we want
            for c in out.outputs:
                ids = list(c.token_ids)
                completions.append(ids)
                logps.append([step[t].logprob for step, t in zip(c.logprobs, ids)])  # the sampled token's log-prob
        return assemble(
            prompt_ids,
            completions,
            logps,
            n,
            pad_id=self.pad_id,
            eos_id=self.eos_id,
            max_new_tokens=sampling.max_new_tokens,
        )

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner  # the colocated worker's model
        runner.model.load_weights(weights=[(n, t.detach()) for n, t in named_tensors])

    def reset_cache(self) -> None:
        self.llm.reset_prefix_cache()
