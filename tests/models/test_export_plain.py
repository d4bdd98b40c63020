"""`posttrain export` beyond the HF layout: --format safetensors writes a plain checkpoint with the same weights,
and a sharded (DCP) checkpoint is consolidated by one process (the 2-process FSDP case: tests/trainers/test_distributed.py)."""

import pytest
import torch
from safetensors.torch import load_file

from posttrain.checkpoints.load import load_checkpoint
from posttrain.cli import main
from posttrain.models.gpt import GPT, GPTConfig
from posttrain.tokenizers.char import CharTokenizer
from posttrain.trainers.checkpoint import save_checkpoint
from posttrain.trainers.distributed import World
from posttrain.trainers.sharded import save_sharded_checkpoint


def _model_and_tok():
    tok = CharTokenizer("0123456789+=")
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, d_model=16, max_seq_len=16)), tok


def test_plain_export_keeps_the_weights(tmp_path):
    model, tok = _model_and_tok()
    save_checkpoint(tmp_path / "ck", model=model, tokenizer=tok, state={"step": 3, "trainer": "sft"})
    assert main(["export", str(tmp_path / "ck"), "--format", "safetensors", "--out", str(tmp_path / "out")]) == 0
    a, b = load_file(tmp_path / "ck" / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert load_checkpoint(tmp_path / "out").step == 3


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP saving without a process group: intended
def test_sharded_checkpoint_exports_in_one_process_and_refuses_merge_lora(tmp_path, capsys):
    model, tok = _model_and_tok()
    opt = torch.optim.AdamW(model.parameters())
    step = save_sharded_checkpoint(tmp_path / "step-2", model, opt, tok, {"step": 2, "trainer": "sft"}, None, World())
    assert main(["export", str(step), "--out", str(tmp_path / "out")]) == 0
    save_checkpoint(tmp_path / "ref", model=model, tokenizer=tok, state={})  # the plain save of the same weights
    got, want = load_file(tmp_path / "out" / "model.safetensors"), load_file(tmp_path / "ref" / "model.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    capsys.readouterr()
    assert main(["export", str(step), "--merge-lora", "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err == (
        f"posttrain export: error: --merge-lora: {step} is a sharded checkpoint, and LoRA is not trained under --fsdp\n"
    )
    assert not (tmp_path / "x").exists()
