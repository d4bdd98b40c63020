"""Local Hugging Face model directories in and out: ``--model DIR`` reads a model and its tokenizer as transformers
does, and a trained model is written so that ``AutoModelForCausalLM.from_pretrained`` opens it and generates what
posttrain's sampler generates (the oracle throughout: transformers itself)."""

import json
import sys
from pathlib import Path

import pytest
import torch

tf = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent))  # the suite runs with --import-mode=importlib
from _hfdirs import demos_file, make_model_dir  # noqa: E402

from posttrain.checkpoints.load import load_checkpoint, load_policy  # noqa: E402
from posttrain.cli import main  # noqa: E402
from posttrain.generate import SamplingConfig, generate  # noqa: E402
from posttrain.models.loading import ModelTokenizer  # noqa: E402
from posttrain.trainers.sft import SFTConfig, train_sft  # noqa: E402

TEXTS = ["12+3=15", "hello world", "<|im_start|>user\n7+8=<|im_end|>", "  the  fox 99\n", "ünïcode ✓"]


@pytest.fixture(scope="module", params=["qwen2", "gpt2"])
def model_dir(request, tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp(request.param) / "m", request.param)


def test_model_dir_reads_as_transformers_does(model_dir):
    ck = load_policy(model_dir)
    tok, hft = ck.tokenizer, tf.AutoTokenizer.from_pretrained(model_dir)
    assert isinstance(tok, ModelTokenizer) and tok.backend == "posttrain"  # posttrain's reader, not AutoTokenizer
    for t in TEXTS:
        ids = tok.encode(t)
        assert ids == hft.encode(t, add_special_tokens=False), t
        assert tok.decode(ids, skip_special_tokens=False) == hft.decode(ids, skip_special_tokens=False)
    assert (tok.pad_id, tok.eos_id, tok.bos_id) == (hft.pad_token_id, hft.eos_token_id, hft.bos_token_id)
    assert tok.chat_template == json.loads((model_dir / "tokenizer_config.json").read_text())["chat_template"]
    ref = tf.AutoModelForCausalLM.from_pretrained(model_dir)
    x = torch.tensor([tok.encode(TEXTS[0])])
    assert torch.equal(ck.model(x).logits, ref(x).logits)


def _greedy_hf(model, prompt: list[int], n: int, eos: int, pad: int) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    return out[0, len(prompt) :].tolist()


def _until_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def test_sft_on_a_model_dir_saves_a_directory_transformers_loads(model_dir, tmp_path):
    out = tmp_path / "sft"
    summary = train_sft(
        SFTConfig(
            out=str(out),
            model_path=str(model_dir),
            steps=4,
            batch_size=4,
            lr=2e-2,
            warmup_steps=0,
            data=str(demos_file(tmp_path / "d.jsonl")),
            eval_data=str(demos_file(tmp_path / "e.jsonl", 4)),
            max_new_tokens=3,
            progress=False,
            eval_every=0,
            save_every=0,
        )
    )
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0]
    saved = out / "model"
    cfg = json.loads((saved / "config.json").read_text())
    assert cfg["model_type"] == json.loads((model_dir / "config.json").read_text())["model_type"]  # not wrapped
    assert {
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "trainer_state.json",
    } <= {p.name for p in saved.iterdir()}
    hf = tf.AutoModelForCausalLM.from_pretrained(saved).eval()
    ours = load_checkpoint(saved)  # posttrain still reads it (--init, --resume)
    assert summary["model_dir"] == str(saved) and isinstance(ours.tokenizer, ModelTokenizer)
    tok = ours.tokenizer
    for p in ("1+2=", "3+0=", "hello"):
        prompt = tok.encode(p)
        g = generate(
            ours.model,
            [prompt],
            pad_id=tok.pad_id,
            eos_id=tok.eos_id,
            cfg=SamplingConfig(max_new_tokens=6, temperature=0),
        )
        mine = g.sequences[0, g.prompt_length :][g.completion_mask[0].bool()].tolist()
        assert _until_eos(mine, tok.eos_id) == _until_eos(_greedy_hf(hf, prompt, 6, tok.eos_id, tok.pad_id), tok.eos_id)


def test_a_tokenizer_without_pad_is_a_one_line_error(tmp_path, capsys):
    d = make_model_dir(tmp_path / "nopad", "qwen2", pad=False)
    data = demos_file(tmp_path / "d.jsonl")
    capsys.readouterr()
    args = [
        "sft",
        "--model",
        str(d),
        "--data",
        str(data),
        "--eval-data",
        str(data),
        "--steps",
        "1",
        "--batch-size",
        "4",
        "--eval-every",
        "0",
        "--save-every",
        "0",
        "--max-new-tokens",
        "2",
        "--progress",
        "false",
    ]
    assert main([*args, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"posttrain sft: error: {d}: the tokenizer has no pad token (tokenizer_config.json pad_token): "
        f"pass --pad-token TOKEN, e.g. --pad-token '<|im_end|>'"
    )
    assert not (tmp_path / "a").exists()
    assert main([*args, "--out", str(tmp_path / "b"), "--pad-token", "<|endoftext|>"]) == 0
    saved = tmp_path / "b" / "model"
    assert tf.AutoTokenizer.from_pretrained(saved).pad_token == "<|endoftext|>"  # written for transformers too
    assert load_checkpoint(saved).tokenizer.pad_id == load_policy(d, pad_token="<|endoftext|>").tokenizer.pad_id


def test_model_and_init_together_are_refused(model_dir, tmp_path):
    from posttrain.errors import UserError

    with pytest.raises(UserError, match="--model and --init both name a starting policy"):
        train_sft(SFTConfig(out=str(tmp_path / "x"), model_path=str(model_dir), init=str(model_dir), steps=1))
