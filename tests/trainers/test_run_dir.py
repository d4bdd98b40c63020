"""Run directories: a new run never lands on an old one, --resume continues only its own run, in its own
directory, and a failed start changes nothing; --init/--resume accept only checkpoints of the right kind."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.checkpoints.layout import checkpoint_state, find_checkpoint, latest_checkpoint
from posttrain.checkpoints.load import load_checkpoint
from posttrain.cli import main
from posttrain.errors import UserError
from posttrain.models.gpt import GPTConfig
from posttrain.run_lock import holder_pid
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers.checkpoint import CheckpointManager
from posttrain.trainers.reward import RMConfig, train_reward_model

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


def sft(capsys, *argv):
    rc = main(["sft", *TINY, *map(str, argv)])
    return rc, capsys.readouterr().err.strip()


def snapshot(d):
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def run_id(d):
    return json.loads((d / "run.json").read_text())["run_id"]


def weights(d):
    return load_checkpoint(d).model.state_dict()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A complete SFT run: checkpoints/step-00000002 and model/ (step 4)."""
    out = tmp_path_factory.mktemp("base") / "run"
    assert main(["sft", *TINY, "--out", str(out)]) == 0
    return out


def test_new_run_into_a_non_empty_dir_refuses_and_changes_nothing(base, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(base, run)
    before = snapshot(run)
    rc, err = sft(capsys, "--out", run)
    assert rc == 2
    assert err == (
        f"posttrain sft: error: --out {run} is not empty (it holds checkpoints, config.resolved.json, "
        f"config.resolved.yaml, ...): pass --overwrite to delete it and start a new run there, or "
        f"--resume {run} to continue the run in it"
    )
    assert snapshot(run) == before
    (tmp_path / "empty").mkdir()  # an existing empty directory is fine
    assert sft(capsys, "--out", tmp_path / "empty")[0] == 0


def test_overwrite_clears_a_run_dir_without_following_symlinks(base, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(base, run)
    old_id = run_id(run)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    (run / "link").symlink_to(outside)
    (run / "checkpoints" / "step-00000001").mkdir()  # leftovers of the old run go too
    rc, err = sft(capsys, "--out", run, "--overwrite", "--seed", "1")
    assert rc == 0 and err == ""
    assert not (run / "link").exists() and (outside / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-00000002"]
    new_id = run_id(run)
    assert new_id != old_id and json.loads((run / "run.json").read_text())["trainer"] == "sft"
    for ck in (run / "model", run / "checkpoints" / "step-00000002"):
        state = json.loads((ck / "trainer_state.json").read_text())
        assert (state["run_id"], state["trainer"]) == (new_id, "sft")


def test_overwrite_refuses_what_is_not_a_run_dir_and_inputs_inside_it(base, tmp_path, capsys):
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    rc, err = sft(capsys, "--out", home, "--overwrite")
    assert rc == 2 and err == (
        f"posttrain sft: error: --overwrite refuses to clear {home}: it is not a posttrain run "
        f"directory (no run.json); empty it yourself or choose another --out"
    )
    assert (home / "thesis.tex").read_text() == "years of work"
    run = tmp_path / "run"
    shutil.copytree(base, run)
    before = snapshot(run)
    rc, err = sft(capsys, "--out", run, "--overwrite", "--init", run / "model")
    assert rc == 2 and err == (
        f"posttrain sft: error: --init {run / 'model'} lies inside --out {run}, which "
        f"--overwrite clears: choose another --out"
    )
    assert snapshot(run) == before


def test_resume_never_continues_another_run(tmp_path, capsys, monkeypatch):
    """The issue's scenario: cp -r A X; sft --out X (killed); sft --resume X must continue X's own run."""
    a, x = tmp_path / "A", tmp_path / "X"
    assert sft(capsys, "--out", a, "--seed", "1")[0] == 0
    shutil.copytree(a, x)
    rc, err = sft(capsys, "--out", x)
    assert rc == 2 and "--overwrite" in err and "--resume" in err
    real_save = CheckpointManager.save

    def save_then_die(self, step, **kw):  # killed right after the step-2 checkpoint
        real_save(self, step, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(CheckpointManager, "save", save_then_die)
    assert sft(capsys, "--out", x, "--overwrite")[0] == 130
    monkeypatch.undo()
    shutil.copytree(a / "model", x / "model")  # what the old code left in place: A's final model, step 4
    rc, err = sft(capsys, "--resume", x)  # outputs go to the resumed run's directory
    assert rc == 0
    assert err == f"warning: ignoring {x / 'model'}: saved by run {run_id(a)}, not by this directory's run {run_id(x)}"
    steps = [json.loads(ln)["step"] for ln in (x / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert sft(capsys, "--out", tmp_path / "full")[0] == 0  # X's run uninterrupted
    got, want = weights(x), weights(tmp_path / "full")
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_resume_goes_to_its_own_run_dir(base, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(base, run)
    rc, err = sft(capsys, "--resume", run / "checkpoints" / "step-00000002", "--out", tmp_path / "other")
    assert rc == 2 and err == (
        f"posttrain sft: error: --resume {run / 'checkpoints' / 'step-00000002'} continues the "
        f"run in {run} and writes there, not to --out {tmp_path / 'other'}: drop --out"
    )
    rc, err = sft(capsys, "--resume", run, "--overwrite")
    assert rc == 2 and err == (
        "posttrain sft: error: --resume and --overwrite exclude each other: --resume continues "
        "a run, --overwrite replaces it with a new one"
    )
    (run / "metrics.jsonl").write_text("")
    rc, err = sft(capsys, "--resume", run / "checkpoints" / "step-00000002")  # a checkpoint inside the run
    assert rc == 0 and err == ""
    assert [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()] == [3, 4]
    lone = tmp_path / "lone"
    shutil.copytree(run / "model", lone)
    rc, err = sft(capsys, "--resume", lone)
    assert rc == 2 and err == (
        f"posttrain sft: error: --resume {lone}: a checkpoint outside a run directory; --resume "
        f"takes a run directory (or a checkpoint inside one), --init {lone} starts a new run "
        f"from its weights"
    )


def test_failed_start_leaves_the_run_dir_unchanged(base, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(base, run)
    before = snapshot(run)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1="}\n')
    rc, err = sft(capsys, "--out", run, "--overwrite", "--data", bad)
    assert rc == 2 and err == f"posttrain sft: error: {bad}:1: missing field 'answer' (needs prompt, answer)"
    assert snapshot(run) == before  # config.resolved.* included: not rewritten before the inputs validate
    rc, err = sft(capsys, "--resume", run, "--lr", "0.001", "--data", bad)  # refused before anything is read
    assert rc == 2 and "lr 0.003 -> 0.001; data None -> " in err
    assert snapshot(run) == before


def test_resume_refuses_flags_that_change_the_run_and_lists_the_others(base, tmp_path, capsys):
    """--resume keeps the run's saved config: a flag that changes what it trains (lr, batch size, data) is an
    error naming each; one that only changes its length or cadence is applied with a note."""
    run = tmp_path / "run"
    shutil.copytree(base, run)
    before = snapshot(run)
    rc, err = sft(capsys, "--resume", run, "--steps", "6", "--lr", "0.001", "--batch-size", "4")
    assert rc == 2 and err == (
        f"posttrain sft: error: --resume {run} continues the run with its own configuration "
        f"({run / 'config.resolved.json'}); these flags would change what it trains: lr 0.003 -> 0.001; "
        "batch_size 8 -> 4. On resume only --progress, --threads, --logger, --steps, --eval-every, --save-every, "
        "--keep-checkpoints, --fsdp, --device, --grad-checkpointing, --compile, --restart-jobs may differ: drop the others, or start a "
        "new run with --out"
    )
    assert snapshot(run) == before
    rc, err = sft(capsys, "--resume", run, "--preset", "single")
    assert rc == 2 and err.endswith("a resumed run keeps its own saved configuration; drop --preset")
    assert main(["sft", *TINY, "--resume", str(run), "--steps", "6", "--progress", "true"]) == 0
    out, err = capsys.readouterr()
    assert "warning" not in err
    assert "note: resuming with changed settings: steps 4 -> 6; progress False -> True" in out
    saved = json.loads((run / "config.resolved.json").read_text())
    assert saved["steps"] == 6 and saved["lr"] == 0.003


@pytest.mark.parametrize("latest", ["../../etc", "/etc", "step-2", "step-00000002/../../../x", "", "\x00\xff"])
def test_latest_outside_the_run_is_ignored(base, tmp_path, capsys, latest):
    ckpts = tmp_path / "run" / "checkpoints"
    shutil.copytree(base / "checkpoints", ckpts)
    elsewhere = tmp_path / "elsewhere" / "step-00000009"
    shutil.copytree(base / "model", elsewhere)
    (ckpts / "step-00000009").symlink_to(elsewhere)  # a link out of the run is never a candidate
    (ckpts / "latest").write_text(latest)
    assert latest_checkpoint(ckpts) == ckpts / "step-00000002"
    got = latest.strip() if latest.isascii() else latest.encode().decode("ascii", errors="replace")
    assert capsys.readouterr().err == (
        f"warning: ignoring {ckpts / 'latest'}: it must name a checkpoint beside it (step-NNNNNNNN), got {got!r}\n"
    )
    (ckpts / "latest").write_text("step-00000009\n")
    assert latest_checkpoint(ckpts) == ckpts / "step-00000002"
    assert "is a symlink" in capsys.readouterr().err
    (ckpts / "latest").unlink()
    (ckpts / "latest").symlink_to(tmp_path / "elsewhere")
    assert latest_checkpoint(ckpts) == ckpts / "step-00000002"


def test_checkpoints_of_two_runs_without_run_json_are_ambiguous(base, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(base, run)
    (run / "run.json").unlink()
    state_file = run / "model" / "trainer_state.json"
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "run_id": "someone-else"}))
    rc, err = sft(capsys, "--resume", run)
    assert rc == 2 and err == (
        f"posttrain sft: error: {run} holds checkpoints of different runs and no run.json: "
        f"name one, e.g. {run / 'checkpoints' / 'step-00000002'}"
    )
    assert find_checkpoint(run / "checkpoints" / "step-00000002") == run / "checkpoints" / "step-00000002"


# ---------------------------------------------------------------------------------------------
# what --init and --resume accept


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("rm")
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
            model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24),
            task=ArithmeticConfig(digits=1, num_demos=20, num_eval=8),
        )
    )
    return out


@pytest.mark.parametrize(
    "argv, role",
    [
        (["sft", "--init", "RM", *TINY], "sft --init"),
        (["dpo", "--init", "RM", "--steps", "1"], "dpo --init"),
        (["grpo", "--init", "RM", "--steps", "1"], "grpo --init"),
        (["rm", "--init", "RM", "--steps", "1"], "rm --init"),
        (["eval", "RM", "--data", "DATA"], "eval"),
    ],
)
def test_a_reward_model_is_not_a_policy(rm_dir, tmp_path, capsys, argv, role):
    data = tmp_path / "e.jsonl"
    data.write_text('{"prompt": "1+2=", "answer": "3"}\n')
    argv = [str(rm_dir) if a == "RM" else str(data) if a == "DATA" else a for a in argv]
    if argv[0] != "eval":
        argv += ["--out", str(tmp_path / "o"), "--progress", "false"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"posttrain {argv[0]}: error: {rm_dir / 'model'} is a reward-model checkpoint (from `posttrain rm`), not a "
        f"policy: {role} needs a language-model checkpoint such as an SFT run"
    )
    assert not (tmp_path / "o").exists()


def _relabel(run, trainer):
    """The run as if another trainer had written it (what the refusal looks at: run.json and trainer_state)."""
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "trainer": trainer}))
    for f in run.rglob("trainer_state.json"):
        f.write_text(json.dumps({**json.loads(f.read_text()), "trainer": trainer}))


@pytest.mark.parametrize(
    "cmd, trainer, command",
    [
        ("sft", "policy_gradient", "grpo"),
        ("sft", "dpo", "dpo"),
        ("dpo", "sft", "sft"),
        ("grpo", "sft", "sft"),
        ("rm", "sft", "sft"),
    ],
)
def test_resume_only_continues_runs_of_the_same_trainer(base, tmp_path, capsys, cmd, trainer, command):
    run = tmp_path / "run"
    shutil.copytree(base, run)
    if trainer != "sft":
        _relabel(run, trainer)
    before = snapshot(run)
    argv = [cmd, "--resume", str(run), *(["--init", str(base)] if cmd == "dpo" else []), "--progress", "false"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"posttrain {cmd}: error: {run} is a `posttrain {command}` run: "
        f"`posttrain {cmd} --resume` continues only its own runs"
    )
    (run / "run.json").unlink()  # no run.json (an older layout): the checkpoint's recorded trainer decides
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"posttrain {cmd}: error: {run / 'model'} is a checkpoint saved by `posttrain {command}`: `posttrain {cmd} "
        f"--resume` continues only its own runs; --init {run / 'model'} starts a new run from its weights"
    )
    del before["run.json"]
    assert snapshot(run) == before


# ---------------------------------------------------------------------------------------------
# properties of the small parsers: arbitrary bytes give a clean answer or a one-line error naming the file


def _fake_checkpoint(d, state=None):
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"")
    (d / "config.json").write_text("{}")
    if state is not None:
        (d / "trainer_state.json").write_text(json.dumps(state))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    content=st.one_of(
        st.binary(max_size=80),
        st.sampled_from([b"step-00000002", b"step-00000003\n", b"step-00000007", b"../step-00000002"]),
    )
)
def test_latest_names_only_a_complete_checkpoint_beside_it(tmp_path_factory, content):
    ckpts = tmp_path_factory.mktemp("c") / "checkpoints"
    _fake_checkpoint(ckpts / "step-00000002")
    _fake_checkpoint(ckpts / "step-00000003")
    (ckpts / "step-00000007").mkdir()  # incomplete
    (ckpts / "latest").write_bytes(content)
    got = latest_checkpoint(ckpts)
    named = content.decode("ascii", errors="replace").strip()
    assert got == (ckpts / named if named in ("step-00000002", "step-00000003") else ckpts / "step-00000003")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    content=st.one_of(
        st.binary(max_size=60),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
            lambda c: (
                st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(["step", "run_id", "x"]), c, max_size=3)
            ),
            max_leaves=6,
        ).map(lambda o: json.dumps(o).encode()),
    )
)
def test_trainer_state_parses_or_names_the_file(tmp_path_factory, content):
    d = tmp_path_factory.mktemp("s")
    (d / "trainer_state.json").write_bytes(content)
    try:
        state = checkpoint_state(d)
    except UserError as e:
        assert str(e).startswith(f"{d / 'trainer_state.json'}: corrupt checkpoint file (") and "\n" not in str(e)
    else:
        assert isinstance(state, dict) and type(state.get("step", 0)) is int
        assert state == json.loads(content)


def test_a_run_that_never_saved_starts_again_keeping_what_else_is_there(tmp_path, capsys):
    """Killed before its first save: the same command (or --resume) starts it again from step 0, with no --overwrite;
    only the run's own files are replaced, and the result is the one an empty directory gives."""
    run = tmp_path / "run"
    assert sft(capsys, "--out", run, "--save-every", "0", "--steps", "1")[0] == 0
    for gone in ("model", "summary.json"):  # as if killed before its first save
        shutil.rmtree(run / gone) if gone == "model" else (run / gone).unlink()
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / ".step-00000001.a1b2c3d4.tmp").mkdir()  # a first save cut short
    (run / "notes.txt").write_text("mine")
    old_id = run_id(run)
    assert sft(capsys, "--out", run, "--save-every", "0", "--steps", "1") == (0, "")
    assert (run / "notes.txt").read_text() == "mine" and run_id(run) != old_id
    assert sorted(p.name for p in run.iterdir()) == [
        "config.resolved.json",
        "config.resolved.yaml",
        "metrics.jsonl",
        "model",
        "notes.txt",
        "run.json",
        "summary.json",
    ]
    assert sft(capsys, "--out", tmp_path / "empty", "--save-every", "0", "--steps", "1")[0] == 0
    got, want = weights(run / "model"), weights(tmp_path / "empty" / "model")
    assert all(torch.equal(got[k], want[k]) for k in want)
    (run / "model").rename(tmp_path / "first_model")
    (run / "summary.json").unlink()
    assert sft(capsys, "--resume", run, "--steps", "1", "--save-every", "0") == (0, "")  # (sft() passes TINY's too)
    got = weights(run / "model")
    assert all(torch.equal(got[k], want[k]) for k in want) and (run / "notes.txt").read_text() == "mine"
    rc, err = sft(capsys, "--resume", run, "--overwrite")
    assert rc == 2 and "--resume and --overwrite exclude each other" in err


@pytest.mark.parametrize("left", ["checkpoints/step-00000002", "summary.json", "model", "restarts", "other trainer"])
def test_only_a_run_with_nothing_saved_is_started_again(tmp_path, capsys, left):
    """A saved checkpoint, a summary (rm --eval-only writes only that), a final model, sft --restarts' runs, or
    another trainer's run: still a run to keep, refused without --overwrite and left as it was."""
    run = tmp_path / "run"
    assert sft(capsys, "--out", run, "--save-every", "0", "--steps", "1")[0] == 0
    shutil.rmtree(run / "model")
    (run / "summary.json").unlink()
    if left == "other trainer":
        (run / "run.json").write_text(json.dumps({**json.loads((run / "run.json").read_text()), "trainer": "dpo"}))
    else:
        (run / left).mkdir(parents=True) if "." not in left else (run / left).write_text("{}")
    before = snapshot(run)
    rc, err = sft(capsys, "--out", run, "--save-every", "0", "--steps", "1")
    assert rc == 2 and f"--out {run} is not empty" in err and snapshot(run) == before


def test_resume_of_a_run_that_never_saved_through_the_python_api_says_what_to_do(tmp_path, capsys):
    run = tmp_path / "run"
    assert sft(capsys, "--out", run, "--save-every", "0", "--steps", "1")[0] == 0
    shutil.rmtree(run / "model")
    with pytest.raises(UserError) as e:
        find_checkpoint(run, prefer_latest=True)
    assert str(e.value) == (
        f"{run} holds no checkpoint yet (its run stopped before the first save): run the same command without "
        f"--resume, which starts it again from step 0"
    )


def test_a_run_dir_of_the_older_layout_resumes_twice(base, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(base, run)
    (run / "run.json").unlink()
    for f in run.rglob("trainer_state.json"):  # checkpoints from before run ids
        f.write_text(json.dumps({k: v for k, v in json.loads(f.read_text()).items() if k != "run_id"}))
    (run / "metrics.jsonl").write_text("")
    assert sft(capsys, "--resume", run / "checkpoints" / "step-00000002", "--steps", "3", "--save-every", "0")[0] == 0
    rid = run_id(run)
    assert json.loads((run / "checkpoints" / "step-00000002" / "trainer_state.json").read_text())["run_id"] == rid
    rc, err = sft(capsys, "--resume", run, "--steps", "4", "--save-every", "0")  # picks model/ (step 3, this run)
    assert rc == 0 and [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()] == [3, 4]


HOLD = "import sys, time\nfrom posttrain.run_lock import lock_dir\nl = lock_dir(sys.argv[1])\nprint('held', flush=True)\ntime.sleep(300)\n"


def test_a_run_dir_another_process_writes_is_refused_naming_its_pid(base, tmp_path, capsys, monkeypatch):
    """Two writers in one directory: while another process holds it (a trainer still running, a worker of a killed
    pipeline), a new run, --overwrite and --resume are one line naming its pid, and nothing is read or cleaned."""
    run = tmp_path / "run"
    shutil.copytree(base, run)
    (run / "checkpoints" / ".model.safetensors.1234.tmp").write_bytes(b"the other writer's temp file")
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, env=env)
    try:
        assert holder.stdout.readline() == b"held\n"
        before = snapshot(run)
        for argv in (("--out", run), ("--out", run, "--overwrite"), ("--resume", run)):
            rc, err = sft(capsys, *argv)
            assert rc == 2 and err == (
                f"posttrain sft: error: {run} is in use by another posttrain process (pid {holder.pid}): wait for "
                f"it to finish, or stop it"
            ), argv
        assert snapshot(run) == before
    finally:
        holder.kill()  # kill -9: the lock goes with the process
        holder.wait(timeout=30)
    seen = []
    real_save = CheckpointManager.save

    def save(self, step, **kw):  # while it trains, the run holds its directory (as the kernel sees it)
        seen.append(holder_pid(run))
        return real_save(self, step, **kw)

    monkeypatch.setattr(CheckpointManager, "save", save)
    assert sft(capsys, "--out", run, "--overwrite")[0] == 0
    assert seen and set(seen) == {os.getpid()}
    assert holder_pid(run) is None  # and lets it go when it ends
