"""``posttrain export CKPT --format hf``: posttrain's GPT as a GPT-2 directory whose model and tokenizer
transformers loads as they are (logits, token ids and greedy generations equal to posttrain's)."""

import pytest
import torch

tf = pytest.importorskip("transformers")

from posttrain.cli import main  # noqa: E402
from posttrain.generate import SamplingConfig, generate  # noqa: E402
from posttrain.models.gpt import GPT, GPTConfig  # noqa: E402
from posttrain.tokenizers import ByteLevelBPETrainer, CharTokenizer  # noqa: E402
from posttrain.trainers.checkpoint import save_checkpoint  # noqa: E402

TEXTS = {"char": ["12+3=", "99-1=0", "7"], "byte-bpe": ["12+3=15", "hello world", "  spaced\nline ✓"]}


def _tokenizer(kind):
    if kind == "char":
        return CharTokenizer("0123456789+-=")
    corpus = [f"{a}+{b}={a + b}" for a in range(30) for b in range(10)] + ["hello world"] * 3
    return ByteLevelBPETrainer(vocab_size=280, special_tokens=("<pad>", "<bos>", "<eos>"), workers=1).train(corpus)


@pytest.mark.parametrize("kind", ["char", "byte-bpe"])
def test_export_gpt_as_gpt2_loads_in_transformers(kind, tmp_path, capsys):
    tok = _tokenizer(kind)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=2, n_head=2, d_model=32, max_seq_len=32)).eval()
    save_checkpoint(tmp_path / "ck", model, tok, {"step": 1, "trainer": "sft"})
    assert main(["export", str(tmp_path / "ck"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    hf = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    hft = tf.AutoTokenizer.from_pretrained(tmp_path / "hf")
    for t in TEXTS[kind]:
        assert hft.encode(t, add_special_tokens=False) == tok.encode(t), t
    assert (hft.pad_token_id, hft.bos_token_id, hft.eos_token_id) == (tok.pad_id, tok.bos_id, tok.eos_id)
    prompt = [tok.bos_id] + tok.encode(TEXTS[kind][0])
    x = torch.tensor([prompt])
    torch.testing.assert_close(hf(x).logits, model(x).logits, atol=1e-5, rtol=1e-5)
    g = generate(
        model, [prompt], pad_id=tok.pad_id, eos_id=tok.eos_id, cfg=SamplingConfig(max_new_tokens=8, temperature=0)
    )
    ours = g.sequences[0, g.prompt_length :][g.completion_mask[0].bool()].tolist()
    theirs = hf.generate(
        x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=8,
        do_sample=False,
        eos_token_id=tok.eos_id,
        pad_token_id=tok.pad_id,
    )[0, len(prompt) :].tolist()
    assert ours == theirs[: len(ours)] and (len(ours) == 8 or ours[-1] == tok.eos_id)


def test_export_refuses_a_non_empty_out(tmp_path, capsys):
    tok = _tokenizer("char")
    save_checkpoint(tmp_path / "ck", GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, d_model=16)), tok, {"step": 1})
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "x").write_text("keep")
    assert main(["export", str(tmp_path / "ck"), "--out", str(tmp_path / "hf")]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"posttrain export: error: --out {tmp_path / 'hf'} exists and is not an empty directory"
    )
