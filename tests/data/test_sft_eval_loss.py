"""SFT reports TRL's ``eval_loss`` on held-out conversations (``--eval-data`` of ``messages``), beside the
generation accuracy. Oracle: the final model's token log-probs on transformers' own rendering of each held-out
conversation, masked by transformers' ``assistant_masks`` (``{% generation %}`` in the template)."""

import json

import pytest
import torch

from posttrain.checkpoints.load import load_checkpoint
from posttrain.trainers import sft


def _conv(a):
    return {"messages": [{"role": "user", "content": f"{a}+1?"}, {"role": "assistant", "content": str(a + 1)}]}


def test_eval_loss_on_heldout_conversations(tmp_path, chat_helpers):
    transformers = pytest.importorskip("transformers")
    tok_dir = chat_helpers.build_tokenizer(tmp_path / "tok")
    init = chat_helpers.init_checkpoint(tmp_path / "init", tok_dir)
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train.write_text("".join(json.dumps(_conv(a)) + "\n" for a in range(8)))
    rows = [_conv(a) for a in range(10, 13)]
    rows[1]["messages"] = [{"role": "system", "content": "Add."}, *rows[1]["messages"]]
    held.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = sft.SFTConfig(out=str(tmp_path / "run"), init=init, data=str(train), eval_data=str(held), steps=3,
                        batch_size=4, eval_every=2, save_every=0, progress=False, warmup_steps=0, lr=1e-2)  # fmt: skip
    summary = sft.train_sft(cfg)

    cfg_json = json.loads((tok_dir / "tokenizer_config.json").read_text())
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tok_dir / "tokenizer.json"), **{k: v for k, v in cfg_json.items() if k.endswith("_token")}
    )
    hf.chat_template = cfg_json["chat_template"]
    ck = load_checkpoint(tmp_path / "run" / "model")
    ck.model.eval()
    nll, n = 0.0, 0
    for r in rows:
        ref = hf.apply_chat_template(r["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        ids = torch.tensor([[ck.tokenizer.bos_id, *ref["input_ids"]]])  # posttrain adds BOS as an id
        mask = torch.tensor(ref["assistant_masks"], dtype=torch.bool)
        with torch.no_grad():
            logp = torch.log_softmax(ck.model(input_ids=ids[:, :-1]).logits.double(), -1)[0]  # (T, V)
        tok_lp = logp.gather(-1, ids[0, 1:, None])[:, 0]  # log p(x_t | x_<t) of each rendered token
        nll -= float(tok_lp[mask].sum())
        n += int(mask.sum())
    assert summary["eval_loss"] == pytest.approx(nll / n, rel=1e-4, abs=1e-5)
    assert summary["eval_demos"] == 3 and summary["heldout_n"] == 3  # generation accuracy on the same rows
    logged = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "eval_loss" in r] == [2, 3]
