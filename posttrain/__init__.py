"""posttrain: the LLM post-training path as small, readable, tested code.

corpus -> dedup -> tokenizer -> causal LM (exact attention) -> SFT -> reward model -> RL -> preference optimisation.
Heavy modules (torch models, trainers) are imported lazily by the CLI; import what you need directly,
e.g. ``from posttrain.models.gpt import GPT, GPTConfig``.
"""

__version__ = "0.1.0"
