"""The pipeline on a chat corpus: ``messages`` conversations are deduplicated on their text, and SFT trains on the
kept conversations (with the model's chat template); a stage option the pipeline sets itself is refused.

Oracles: the corpus's own duplicates counted by brute force (exact copies of a conversation), the SFT stage's own
count of demonstrations, and transformers' chat template file saved with the model."""

import json
import sys
from pathlib import Path

import pytest

tf = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))  # the suite runs with --import-mode=importlib
from _hfdirs import make_model_dir  # noqa: E402

from posttrain.config import build_config  # noqa: E402
from posttrain.errors import ConfigError  # noqa: E402
from posttrain.pipeline.config import PRESETS, PipelineConfig  # noqa: E402
from posttrain.pipeline.run import run_pipeline  # noqa: E402

WORDS = ["red fox", "blue owl", "tall elm", "cold sea", "dry sand"]
VERBS = ["runs", "sings", "grows", "waits"]


def _conv(a, b):  # short (the micro model's window is 64 tokens) and unlike each other (no near duplicates)
    return {"messages": [{"role": "user", "content": f"{WORDS[a]} {VERBS[b]}?"},
                         {"role": "assistant", "content": f"{b}{a}"}]}  # fmt: skip


def test_chat_corpus_end_to_end_through_sft(tmp_path):
    model = make_model_dir(tmp_path / "hf", "gpt2")
    rows = [_conv(a, b) for a in range(5) for b in range(4)]
    rows += [rows[0], rows[3], rows[3]]  # exact copies: dedup keeps one of each
    corpus = tmp_path / "chat.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    unique = len({json.dumps(r, sort_keys=True) for r in rows})
    evals = tmp_path / "eval.jsonl"
    evals.write_text(
        "".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a in (7, 8) for b in (1, 2))
    )
    cfg = build_config(PipelineConfig, PRESETS["micro"], overrides={"hf_model": str(model), "corpus_file": str(corpus),
                       "eval_file": str(evals), "contamination_run": False})  # fmt: skip
    run_pipeline(cfg, tmp_path / "run", only=("dedup", "tokenizer", "sft"), quiet=True)
    dedup = json.loads((tmp_path / "run" / "dedup" / "summary.json").read_text())
    assert dedup["removed"]["exact"] == len(rows) - unique
    kept = [json.loads(x) for x in (tmp_path / "run" / "dedup" / "sft.jsonl").read_text().splitlines()]
    assert len(kept) == dedup["conversations_kept"] == unique and all("messages" in r for r in kept)
    sft = json.loads((tmp_path / "run" / "sft" / "summary.json").read_text())
    assert sft["num_demos"] == unique  # the kept conversations, not a replacement
    template = (tmp_path / "run" / "sft" / "model" / "chat_template.jinja").read_text()
    assert template == tf.AutoTokenizer.from_pretrained(model).chat_template


def test_a_stage_option_the_pipeline_sets_is_refused():
    with pytest.raises(ConfigError, match=r"sft.data='mine.jsonl': the pipeline sets it .*corpus_file"):
        build_config(PipelineConfig, PRESETS["micro"], overrides={"sft.data": "mine.jsonl"})
