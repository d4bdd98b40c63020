"""Metrics sinks: metrics.jsonl always, TensorBoard and W&B (offline) combinable, the run's config sent to each,
and TRL's metric names (train/..., eval/...) in the sinks.

Oracles: transformers' own ``rewrite_logs`` (how TRL's logs are named in TensorBoard and W&B), the values in
metrics.jsonl (each sink must hold the same numbers), tensorboard's event reader, and the W&B run file read
record by record (its log format: 7-byte record headers in 32 KiB blocks).
"""

import json
import struct

import pytest

from posttrain.cli import main
from posttrain.errors import ConfigError
from posttrain.loggers import parse_loggers, trl_name
from posttrain.trainers.sft import SFTConfig

SFT = ["--preset", "tiny", "--steps", "3", "--batch-size", "8", "--eval-every", "0", "--save-every", "0"]
SFT += ["--progress", "false", "--restarts", "1", "--model.n-layer", "1", "--model.d-model", "32"]
SFT += ["--model.n-head", "2", "--task.digits", "1", "--task.num-demos", "20", "--task.num-eval", "8"]


def test_parse_loggers_combines_and_always_keeps_jsonl():
    assert parse_loggers("wandb") == ("jsonl", "wandb")
    assert parse_loggers("jsonl, tensorboard,wandb,jsonl") == ("jsonl", "tensorboard", "wandb")
    with pytest.raises(ConfigError, match="mlflow is not a sink"):
        SFTConfig(logger="jsonl,mlflow")


@pytest.mark.parametrize(
    "key", ["loss", "eval_loss", "eval_rewards/accuracies", "rewards/margins", "grad_norm", "lr", "eval_runtime"]
)
def test_names_follow_transformers_rewrite_logs(key):
    from transformers.integrations.integration_utils import rewrite_logs

    assert {trl_name(key): 1.0} == rewrite_logs({key: 1.0})


def test_heldout_metrics_are_eval_metrics():
    assert trl_name("heldout_accuracy") == "eval/accuracy"


def _wandb_records(path):
    """Protobuf records of a W&B run file (header ':W&B' + magic + version; LevelDB-style log blocks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, buf = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and n == 0:
            break
        buf += data[pos : pos + n]
        pos += n
        if kind in (1, 4):  # a full record, or the last piece of one
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def test_tensorboard_and_wandb_together(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    assert main(["sft", "--out", str(out), "--logger", "jsonl,tensorboard,wandb", "--lr", "0.002", *SFT]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in rows if "loss" in r}  # metrics.jsonl keeps its own names
    assert sorted(losses) == [1, 2, 3]

    ev = EventAccumulator(str(out / "tensorboard"))
    ev.Reload()
    tb = {e.step: e.value for e in ev.Scalars("train/loss")}
    assert tb.keys() == losses.keys() and all(tb[s] == pytest.approx(losses[s], rel=1e-6) for s in tb)
    assert "config" in "".join(ev.Tags()["tensors"])  # the run's config as a text entry

    (run_file,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    records = list(_wandb_records(run_file))
    config = {i.key: json.loads(i.value_json) for r in records if r.HasField("run") for i in r.run.config.update}
    assert config["lr"] == 0.002 and config["steps"] == 3  # the run's resolved config
    history = {}
    for r in records:
        if r.HasField("history"):
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            history[items["_step"]] = items
    assert {s: h["train/loss"] for s, h in history.items() if "train/loss" in h} == pytest.approx(losses)
    assert "eval/accuracy" in history[3]  # heldout_accuracy, under TRL's eval/ prefix


TIMED = ("time", "_per_s")


def _untimed(path):
    recs = [json.loads(ln) for ln in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMED)} for r in recs]


def test_metrics_upto_drops_a_cut_short_last_line_and_refuses_a_bad_one_before_it(tmp_path, capsys):
    from posttrain.errors import UserError
    from posttrain.loggers import metrics_upto

    f = tmp_path / "metrics.jsonl"
    whole = ['{"step": 1, "loss": 2.5}', '{"step": 2, "loss": "\u00e9"}', '{"step": 3, "loss": 1.5}']
    for cut in ('{"step": 4, "lo', '{"step": 4, "loss": "\u00e9"}'.encode()[:-4].decode("utf-8", "ignore"), "[1"):
        f.write_text("\n".join([*whole, cut]))
        assert metrics_upto(f, 2) == whole[:2] and metrics_upto(f, 9) == whole
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 2 and err[0].startswith(f"warning: {f}:4: dropping its last line, cut short by a write")
    f.write_bytes('{"step": 1}\n{"step": 2, "loss": "\u00e9"}'.encode()[:-3])  # cut inside a UTF-8 character
    assert metrics_upto(f, 5) == ['{"step": 1}'] and "not valid UTF-8" in capsys.readouterr().err
    for bad, why in (('{"step": 2, "lo', "not valid JSON"), ('"step"', "a JSON str"), ('{"step": "2"}', "its step")):
        f.write_text("\n".join([whole[0], bad, whole[2], ""]))
        with pytest.raises(UserError) as e:
            metrics_upto(f, 5)
        assert str(e.value).startswith(f"{f}:2: not a metrics record ({why}") and "\n" not in str(e.value)


def test_resume_after_a_kill_mid_write_of_metrics_continues(tmp_path, capsys):
    """A process killed while writing metrics.jsonl leaves half a line: --resume drops it with one warning and the
    file ends as an uninterrupted run's; a damaged line before the last is exit 2 naming file:line, nothing changed."""
    full, out = tmp_path / "full", tmp_path / "run"
    args = [*SFT, "--save-every", "2", "--steps", "3"]
    assert main(["sft", *args, "--out", str(full)]) == 0
    assert main(["sft", *args, "--out", str(out)]) == 0
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    assert [json.loads(ln)["step"] for ln in lines] == [1, 2, 3]
    capsys.readouterr()
    metrics.write_text("\n".join([lines[0], '{"step": 2, "lo', *lines[2:]]) + "\n")
    before = metrics.read_bytes()
    assert main(["sft", "--resume", str(out / "checkpoints" / "step-00000002")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"posttrain sft: error: {metrics}:2: not a metrics record (not valid JSON: Unterminated string starting at: "
        "column 13); lines after it are intact, so this is not a cut-short write: fix or delete that line, then "
        "resume again"
    )
    assert metrics.read_bytes() == before
    metrics.write_text("\n".join(lines) + '\n{"step": 4, "loss": 0.12')  # the half line of a kill mid-write
    assert main(["sft", "--resume", str(out / "checkpoints" / "step-00000002")]) == 0
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"warning: {metrics}:4: dropping its last line, cut short by a write") and "\n" not in err
    assert _untimed(metrics) == _untimed(full / "metrics.jsonl")
