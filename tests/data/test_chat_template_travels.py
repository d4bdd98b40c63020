"""The chat template a model was trained with goes where the model goes: ``sft --chat-template chatml`` saves it,
``posttrain export`` writes it where transformers reads it, ``posttrain eval`` renders conversational prompts
with it (no flag needed). Oracle: transformers' ``AutoTokenizer`` on the exported directory, its
``chat_template`` and ``apply_chat_template``."""

import json

import pytest

from posttrain.cli import main

transformers = pytest.importorskip("transformers")


def test_template_travels_from_sft_to_export_and_eval(tmp_path, chat_helpers):
    tok_dir = chat_helpers.build_tokenizer(tmp_path / "tok", template=None)  # a tokenizer without a template
    init = chat_helpers.init_checkpoint(tmp_path / "init", tok_dir)
    conv = [
        {"messages": [{"role": "user", "content": f"{a}+1?"}, {"role": "assistant", "content": str(a + 1)}]}
        for a in range(8)
    ]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in conv))
    evals = tmp_path / "eval.jsonl"
    rows = [{"prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": f"{a}+1?"}], "answer": a + 1}
            for a in range(3)]  # fmt: skip
    evals.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    argv = ["sft", "--init", init, "--data", str(data), "--eval-data", str(evals), "--chat-template", "chatml"]
    argv += ["--out", str(run), "--steps", "2", "--batch-size", "4", "--eval-every", "0", "--save-every", "0"]
    assert main([*argv, "--progress", "false", "--max-new-tokens", "3"]) == 0
    saved = (run / "model" / "chat_template.jinja").read_text()

    out = tmp_path / "hf"
    assert main(["export", str(run), "--out", str(out)]) == 0
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert hf_tok.chat_template == saved
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == saved

    ev = tmp_path / "ev"
    assert main(["eval", str(run), "--data", str(evals), "--out", str(ev), "--max-new-tokens", "3"]) == 0
    got = [json.loads(x)["prompt"] for x in (ev / "completions.jsonl").read_text().splitlines()]
    want = [hf_tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    assert got == want and all(p.endswith("<|im_start|>assistant\n") for p in got)
