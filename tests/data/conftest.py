"""A tiny byte-level BPE tokenizer with ChatML tokens and a chat template, built in the test (no download)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

SPECIALS = ["<pad>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>"]
# ChatML with transformers' {% generation %} markers: the reference for the assistant mask
CHATML_GENERATION = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}"
    "{% else %}{{ m['content'] }}<|im_end|>{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "What is 2+3? The answer is 5.",
    "Natalia sold 48 clips in April and half as many in May.",
    "hello there, how are you today?",
    "system user assistant question answer #### 72",
    "0123456789 +-=*/",
]


def build_tokenizer(d: Path, vocab_size: int = 320, template: str | None = CHATML_GENERATION) -> Path:
    """tokenizer.json (+ tokenizer_config.json with ``template``) in ``d``; returns ``d``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS * 20,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    if template is not None:
        (d / "tokenizer_config.json").write_text(
            json.dumps(
                {
                    "chat_template": template,
                    "bos_token": "<bos>",
                    "eos_token": "<|im_end|>",
                    "pad_token": "<pad>",
                    "tokenizer_class": "PreTrainedTokenizerFast",
                }
            )
        )
    return d


def init_checkpoint(d: Path, tok_dir: Path, max_seq_len: int = 128) -> str:
    """A posttrain policy checkpoint (tiny GPT) whose tokenizer (and chat template) is the one in ``tok_dir``."""
    import shutil

    import torch

    from posttrain.models.gpt import GPT, GPTConfig
    from posttrain.tokenizers import load
    from posttrain.trainers.checkpoint import save_checkpoint

    tok = load(tok_dir / "tokenizer.json")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, d_model=32, max_seq_len=max_seq_len))
    save_checkpoint(d, model=model, tokenizer=tok, state={"step": 0, "trainer": "sft"})
    if (tok_dir / "tokenizer_config.json").is_file():
        shutil.copy(tok_dir / "tokenizer_config.json", d / "tokenizer_config.json")
    return str(d)


@pytest.fixture(scope="session")
def chat_helpers():
    """The builders above, for tests (conftest modules are not importable under --import-mode=importlib)."""
    return SimpleNamespace(
        build_tokenizer=build_tokenizer, init_checkpoint=init_checkpoint, CHATML_GENERATION=CHATML_GENERATION
    )
