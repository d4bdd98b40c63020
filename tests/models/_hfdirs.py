"""Tiny local Hugging Face model directories for tests: a random Qwen2 or GPT-2 (~50k parameters) saved with
``save_pretrained``, and a byte-level BPE tokenizer trained by posttrain, with a chat template."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from posttrain.tokenizers import ByteLevelBPETrainer

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [f"{a}+{b}={a + b}" for a in range(40) for b in range(0, 40, 3)] + ["the quick brown fox", "hello world"]

_TOKENIZER_CACHE: dict = {}
# transformers 5 rebuilds a Qwen2 directory's tokenizer with Qwen's own pipeline (NFC, this regex, byte-level),
# whatever tokenizer.json says: a Qwen2 test tokenizer must use it to tokenize as transformers does
QWEN2_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"""
    r"""\s+(?!\S)|\s+"""
)


def _train(kind: str):
    """posttrain's byte-level BPE (GPT-2 regex) for gpt2; the tokenizers library with Qwen2's pipeline for qwen2."""
    if kind == "gpt2":
        return ByteLevelBPETrainer(vocab_size=300, special_tokens=SPECIALS, workers=1).train(CORPUS)
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_REGEX), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=list(SPECIALS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return tok


def tokenizer_files(d: Path, kind: str = "qwen2", pad: bool = True):
    """tokenizer.json + tokenizer_config.json (eos, pad unless not ``pad``, a ChatML template) into ``d``."""
    if kind not in _TOKENIZER_CACHE:
        _TOKENIZER_CACHE[kind] = _train(kind)
    tok = _TOKENIZER_CACHE[kind]
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "bos_token": None,
        "chat_template": CHATML,
        "model_max_length": 64,
    }
    if pad:
        cfg["pad_token"] = "<|endoftext|>"
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return tok


def make_model_dir(d: Path, kind: str = "qwen2", pad: bool = True, seed: int = 0) -> Path:
    """A random ``kind`` (qwen2 | gpt2) causal LM directory with a real tokenizer."""
    import transformers as tf

    tok = tokenizer_files(d, kind, pad=pad)
    ids = dict(
        vocab_size=tok.get_vocab_size() if hasattr(tok, "get_vocab_size") else tok.vocab_size,
        eos_token_id=tok.token_to_id("<|im_end|>"),
        pad_token_id=tok.token_to_id("<|endoftext|>") if pad else None,
        bos_token_id=None,
    )
    if kind == "qwen2":
        cfg = tf.Qwen2Config(
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            hidden_size=32,
            intermediate_size=64,
            max_position_embeddings=64,
            tie_word_embeddings=True,
            **ids,
        )
    else:
        cfg = tf.GPT2Config(
            n_layer=2, n_head=2, n_embd=32, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ids
        )
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(d)
    return d


def demos_file(path: Path, n: int = 16) -> Path:
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(n // 4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def pairs_file(path: Path, n: int = 12) -> Path:
    rows = [
        {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)}
        for a in range(3)
        for b in range(n // 3)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
