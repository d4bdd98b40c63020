"""``posttrain export`` of a reward model writes transformers' sequence-classification layout: it loads in
``AutoModelForSequenceClassification`` with nothing missing (``score.weight`` is the reward head) and scores what
posttrain scores. Oracle: transformers itself (its loading report and its forward pass)."""

import sys
from pathlib import Path

import pytest
import torch

tf = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent))  # the suite runs with --import-mode=importlib
from _hfdirs import make_model_dir, pairs_file  # noqa: E402

from posttrain.cli import main  # noqa: E402
from posttrain.data.preference import encode_completion, encode_prompt, pack_prompt_completion  # noqa: E402
from posttrain.models.gpt import GPT, GPTConfig  # noqa: E402
from posttrain.models.heads import RewardModel  # noqa: E402
from posttrain.rewards.reward_model import load_reward_model
from posttrain.tasks.arithmetic import ALPHABET  # noqa: E402
from posttrain.tokenizers.char import CharTokenizer  # noqa: E402
from posttrain.trainers.checkpoint import save_reward_checkpoint  # noqa: E402

PROMPTS, COMPLETIONS = ["1+2=", "7+8=", "3+3="], ["3", "15", "7"]


def _gpt_rm(d: Path) -> Path:
    torch.manual_seed(0)
    tok = CharTokenizer(ALPHABET)
    rm = RewardModel(GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, d_model=16, max_seq_len=32)))
    with torch.no_grad():
        rm.head.proj.bias.fill_(0.75)  # an offset the layout has no place for: kept in config.json
    save_reward_checkpoint(d, rm, tok, state={"step": 0, "trainer": "rm"})
    return d


def _hf_rm(d: Path, tmp: Path) -> Path:
    from posttrain.trainers.reward import RMConfig, train_reward_model

    base, pairs = make_model_dir(tmp / "gpt2", "gpt2"), pairs_file(tmp / "p.jsonl")
    cfg = RMConfig(out=str(d), model_path=str(base), steps=2, batch_size=4, lr=5e-2, warmup_steps=0, data=str(pairs),
                   eval_data=str(pairs), progress=False, eval_every=0, save_every=0)  # fmt: skip
    train_reward_model(cfg)
    return d


@pytest.mark.parametrize("kind", ["posttrain-gpt", "hf-gpt2"])
def test_reward_model_exports_as_sequence_classification(kind, tmp_path):
    src = _gpt_rm(tmp_path / "rm") if kind == "posttrain-gpt" else _hf_rm(tmp_path / "rm", tmp_path)
    out = tmp_path / "cls"
    assert main(["export", str(src), "--out", str(out)]) == 0
    model, info = tf.AutoModelForSequenceClassification.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info  # score.weight present, not random
    assert model.config.num_labels == 1 and model.config.pad_token_id is not None

    ours = load_reward_model(src)
    tok = ours.tokenizer
    b = pack_prompt_completion([encode_prompt(tok, p) for p in PROMPTS], [encode_completion(tok, c) for c in COMPLETIONS],
                               tok.pad_id)  # fmt: skip
    assert int(b["input_ids"][b["attention_mask"] == 1].eq(model.config.pad_token_id).sum()) == 0  # pads are padding
    with torch.no_grad():
        want = ours.score(PROMPTS, COMPLETIONS)  # raw rewards (B,)
        got = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, 0]
    bias = model.config.posttrain_reward["bias"]
    assert torch.allclose(got.double() + bias, want.double(), atol=1e-5, rtol=1e-5), (got + bias, want)
    assert len(set(torch.round(want, decimals=4).tolist())) > 1  # the rewards differ: the comparison can fail
