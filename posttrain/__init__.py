"""posttrain: the LLM post-training path as small, readable, tested code.

corpus -> dedup -> tokenizer -> causal LM (exact attention) -> SFT -> reward model -> RL -> preference optimisation.
Heavy modules (torch models, trainers) are imported lazily by the CLI; import what you need directly,
e.g. ``from posttrain.models.gpt import GPT, GPTConfig``.
"""

from importlib.metadata import PackageNotFoundError, version

try:  # one version, one place: pyproject.toml's, as the installed package's metadata carries it
    __version__ = version("posttrain")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
