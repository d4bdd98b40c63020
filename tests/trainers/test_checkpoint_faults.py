"""Checkpoint faults: every corrupt file is a one-line error naming it (exit 2, never a traceback, never torch's
advice to unpickle), and a periodic checkpoint that cannot be written costs a warning, not the run."""

import collections
import errno
import json
import shutil

import pytest
import torch
from safetensors import SafetensorError

import posttrain.models
import posttrain.trainers.checkpoint as checkpoint
from posttrain.checkpoints.load import load_checkpoint
from posttrain.cli import main
from posttrain.errors import UserError
from posttrain.models.gpt import GPTConfig
from posttrain.rewards.reward_model import HEAD_FILE, load_reward_model
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers.reward import RMConfig, train_reward_model
from posttrain.trainers.sft import SFTConfig, train_sft

TINY = [
    "--steps",
    "4",
    "--batch-size",
    "8",
    "--eval-every",
    "0",
    "--save-every",
    "2",
    "--progress",
    "false",
    "--restarts",
    "1",
    "--model.n-layer",
    "1",
    "--model.d-model",
    "32",
    "--model.n-head",
    "2",
    "--task.digits",
    "1",
    "--task.num-demos",
    "20",
    "--task.num-eval",
    "8",
]
MODEL = GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24)
TASK = ArithmeticConfig(digits=1, num_demos=20, num_eval=8)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    out = tmp_path_factory.mktemp("base") / "run"
    assert main(["sft", *TINY, "--out", str(out)]) == 0
    return out


def _truncate(f):
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


class Gadget:  # any object that is not a tensor or a plain container
    pass


def _evil(f):
    torch.save({"state": {}, "param_groups": [], "x": Gadget(), "factory": collections.OrderedDict}, f)


CORRUPT = {  # file, how, the command that reads it, expected message after "FILE: " (None: a prefix, see below)
    "weights truncated": ("model.safetensors", _truncate, "eval", None),
    "weights empty": ("model.safetensors", lambda f: f.write_bytes(b""), "eval", None),
    "config garbage": (
        "config.json",
        lambda f: f.write_text("{model_type: gpt"),
        "eval",
        "corrupt checkpoint file (not valid JSON: Expecting property name enclosed in double quotes "
        "at line 1 column 2)",
    ),
    "config a list": (
        "config.json",
        lambda f: f.write_text("[1, 2]"),
        "eval",
        "corrupt checkpoint file (expected a JSON object, got list)",
    ),
    "config no type": ("config.json", lambda f: f.write_text("{}"), "eval", "corrupt checkpoint file (no model_type)"),
    "config wrong shape": (
        "config.json",
        lambda f: f.write_text(
            json.dumps(
                {
                    "model_type": "posttrain-gpt",
                    "config": {"n_layer": 1, "n_head": 2, "d_model": 48, "vocab_size": 20, "max_seq_len": 24},
                }
            )
        ),
        "eval",
        None,
    ),
    "state empty": ("trainer_state.json", lambda f: f.write_text(""), "eval", "corrupt checkpoint file (empty)"),
    "state garbage": (
        "trainer_state.json",
        lambda f: f.write_bytes(b"\x89PNG\r\n"),
        "eval",
        "corrupt checkpoint file (not valid UTF-8 at byte 0)",
    ),
    "state bad step": (
        "trainer_state.json",
        lambda f: f.write_text('{"step": "many"}'),
        "eval",
        "corrupt checkpoint file ('step' is 'many', not an integer)",
    ),
    "optimizer truncated": ("optimizer.pt", _truncate, "sft", None),
    "optimizer not a state": (
        "optimizer.pt",
        lambda f: torch.save([1, 2], f),
        "sft",
        "corrupt checkpoint file (expected a dict, got list)",
    ),
    "optimizer pickle": (
        "optimizer.pt",
        _evil,
        "sft",
        "corrupt or unreadable checkpoint file (refused: it holds Python objects other than tensors "
        "and plain containers, which posttrain never unpickles)",
    ),
    "rng pickle": (
        "rng.pt",
        _evil,
        "sft",
        "corrupt or unreadable checkpoint file (refused: it holds Python objects other than tensors and "
        "plain containers, which posttrain never unpickles)",
    ),
}


@pytest.mark.parametrize("case", list(CORRUPT))
def test_a_corrupt_checkpoint_file_is_one_line_naming_it(base, tmp_path, capsys, case):
    name, corrupt, cmd, tail = CORRUPT[case]
    run = tmp_path / "run"
    shutil.copytree(base, run)
    corrupt(run / "model" / name)
    data = tmp_path / "e.jsonl"
    data.write_text('{"prompt": "1+2=", "answer": "3"}\n')
    argv = ["eval", str(run), "--data", str(data)] if cmd == "eval" else ["sft", *TINY, "--resume", str(run)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    head = f"posttrain {cmd}: error: {run / 'model' / name}: "
    assert len(err.splitlines()) == 1 and "weights_only" not in err and "Traceback" not in err
    if tail is not None:
        assert err == head + tail + "\n"
    elif name == "config.json":
        assert err.startswith(f"posttrain {cmd}: error: {run / 'model' / name}: does not describe the saved model (")
    else:  # the reader's own reason (safetensors' / torch's wording varies by version)
        assert err.startswith(head + "corrupt or unreadable checkpoint file (") and err.endswith(")\n")


def test_a_corrupt_reward_head_names_the_file(tmp_path):
    out = tmp_path / "rm"
    train_reward_model(
        RMConfig(
            out=str(out),
            steps=1,
            batch_size=4,
            eval_every=0,
            save_every=0,
            progress=False,
            eval_prompts=8,
            stats_pairs=8,
            model=MODEL,
            task=TASK,
        )
    )
    _truncate(out / "model" / HEAD_FILE)
    with pytest.raises(UserError, match=rf"^{out / 'model' / HEAD_FILE}: corrupt or unreadable checkpoint file \("):
        load_reward_model(out)


def _sft(out, **kw):
    base = dict(
        out=str(out),
        steps=4,
        batch_size=8,
        eval_every=0,
        save_every=1,
        warmup_steps=2,
        progress=False,
        model=MODEL,
        task=TASK,
    )
    return train_sft(SFTConfig(**{**base, **kw}))


def _fail_once(monkeypatch, module, name, exc):
    real, calls = getattr(module, name), []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise exc
        return real(*a, **k)

    monkeypatch.setattr(module, name, flaky)


@pytest.mark.parametrize(
    "where, exc, reason",
    [
        (
            (posttrain.models, "_st_save_model"),  # how safetensors reports a full disk
            SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
            "cannot write (Error while serializing: I/O error: No space left on device (os error 28)) (RUN/checkpoints/"
            "step-00000001)",
        ),
        (
            (torch, "save"),
            RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"),
            "cannot write ([enforce fail at inline_container.cc:672]) (RUN/checkpoints/step-00000001)",
        ),  # torch.save's
        ((torch, "save"), OSError(errno.EROFS, "Read-only file system"), "Read-only file system"),
    ],
)
def test_a_failed_periodic_checkpoint_warns_and_the_run_goes_on(tmp_path, capsys, monkeypatch, where, exc, reason):
    _sft(tmp_path / "full")
    capsys.readouterr()
    _fail_once(monkeypatch, *where, exc)
    run = tmp_path / "run"
    _sft(run)
    err = capsys.readouterr().err
    assert err == (
        f"warning: checkpoint step-00000001 not saved: {reason.replace('RUN', str(run))}; training goes "
        f"on, the next save retries\n"
    )
    ckpts = run / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-00000002", "step-00000003"]
    assert (ckpts / "latest").read_text() == "step-00000003\n"
    a, b = load_checkpoint(tmp_path / "full").model.state_dict(), load_checkpoint(run).model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # as if nothing had happened


def test_a_failed_final_save_raises_and_leaves_no_temp(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint.torch, "save", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(OSError, match="full"):
        _sft(tmp_path / "run", save_every=0, steps=2)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "config.resolved.json",
        "config.resolved.yaml",
        "metrics.jsonl",
        "run.json",
    ]
