"""The pipeline as a careless or hostile user drives it: it deletes only what it wrote, reuses a stage only while
its outputs are the bytes it wrote, keys path-valued options by their contents, and never leaves a writer behind.

Oracles: the directory's bytes before and after (a refusal changes nothing), the first run's outputs (a repaired
stage is bitwise what it was), the kernel's view of processes (/proc) and of locks (/proc/locks).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.config import build_config
from posttrain.errors import UserError
from posttrain.pipeline import cache
from posttrain.pipeline.config import PRESETS, PipelineConfig
from posttrain.pipeline.run import run_pipeline
from posttrain.pipeline.run_dir import foreign_files
from posttrain.run_lock import check_free, holder_pid

ROOT = str(Path(__file__).resolve().parents[2])
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
AFTER_SFT = ("rm", "dpo", "grpo", "ppo")


def micro(**overrides):
    return build_config(PipelineConfig, PRESETS["micro"], overrides=overrides)


def statuses(result) -> dict:
    return {k: v["status"] for k, v in result["stages"].items()}


def snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def pipeline_cli(capsys, out, *extra) -> tuple[int, str]:
    rc = main(["pipeline", "--preset", "micro", "--quiet", "--out", str(out), *map(str, extra)])
    return rc, capsys.readouterr().err.strip()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipe") / "micro"
    result = run_pipeline(micro(), out, quiet=True, preset="micro")
    return out, result


@pytest.fixture
def copy(run, tmp_path):
    out, _ = run
    c = tmp_path / "copy"
    shutil.copytree(out, c)
    return c


class Holder:
    """Another process holding a directory's lock (as a running trainer or pipeline would)."""

    def __init__(self, d: Path):
        code = "import sys, time\nfrom posttrain.run_lock import lock_dir\nl = lock_dir(sys.argv[1])\n"
        code += "print('held', flush=True)\ntime.sleep(300)\n"
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(d)], stdout=subprocess.PIPE, env=ENV)
        assert self.proc.stdout.readline() == b"held\n"
        self.pid = self.proc.pid

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=30)


# ---------------------------------------------------------------------------------------------
# 3. only what the pipeline wrote is ever deleted


def test_a_directory_of_the_users_files_is_refused_and_nothing_is_deleted(tmp_path, capsys):
    out = tmp_path / "P"
    (out / "sft").mkdir(parents=True)
    (out / "dedup").mkdir()
    (out / "sft" / "notes.txt").write_text("x\n")
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    rc, err = pipeline_cli(capsys, out)
    assert rc == 2 and "\n" not in err and "is not empty and is not a pipeline run" in err and "sft" in err
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
    assert (out / "sft" / "notes.txt").read_text() == "x\n"
    rc, err = pipeline_cli(capsys, out, "--explain")  # nor is it described as if it were one
    assert rc == 2 and "not a pipeline run" in err


def test_a_finished_trainer_run_is_refused(tmp_path, capsys):
    d = tmp_path / "sft_run"
    argv = ["--steps", "2", "--batch-size", "4", "--eval-every", "0", "--save-every", "0", "--progress", "false"]
    argv += ["--restarts", "1", "--model.n-layer", "1", "--model.d-model", "16", "--model.n-head", "2"]
    argv += ["--task.digits", "1", "--task.num-demos", "8", "--task.num-eval", "4", "--max-new-tokens", "3"]
    assert main(["sft", *argv, "--out", str(d)]) == 0
    capsys.readouterr()
    before = snapshot(d)
    rc, err = pipeline_cli(capsys, d)
    assert rc == 2 and "\n" not in err and "is a `posttrain sft` run, not a pipeline run" in err
    assert snapshot(d) == before  # its summary.json untouched


@pytest.mark.parametrize("where", ["/dev", "/dev/posttrain-probe", "/proc/posttrain-probe", "/sys/fs", "/"])
def test_system_directories_are_refused(where, capsys):
    existed = os.path.exists(where)
    rc, err = pipeline_cli(capsys, where)
    assert rc == 2 and "\n" not in err and "is a system directory" in err
    assert os.path.exists(where) == existed  # nothing created (root could have made /dev/posttrain-probe)
    assert not os.path.exists(os.path.join(where, ".pipeline"))


def test_a_users_file_in_a_stage_directory_stops_a_rerun_and_nothing_is_deleted(copy, capsys):
    (copy / "sft" / "notes.txt").write_text("my notes\n")
    before = snapshot(copy / "sft")
    with pytest.raises(UserError, match=r"sft/notes.txt was not written by the pipeline: move it out of .*sft, which"):
        run_pipeline(micro(**{"sft.steps": 20}), copy, quiet=True)
    assert snapshot(copy / "sft") == before  # the stage's own files too: nothing was cleared
    again = run_pipeline(micro(), copy, quiet=True)  # the unchanged config still finds every stage complete
    assert statuses(again)["sft"] == "cached" and (copy / "sft" / "notes.txt").read_text() == "my notes\n"
    rc, err = pipeline_cli(capsys, copy, "--config", _toml(copy.parent / "c.toml", "[sft]\nsteps = 20\n"))
    assert rc == 2 and "\n" not in err and "notes.txt" in err  # and on the command line, one line, exit 2


def _toml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_which_files_in_a_stage_directory_are_the_pipelines(tmp_path):
    """Listed in DONE.json -> the pipeline's; of an unfinished run -> the pipeline's if written since it started."""
    d = tmp_path / "sft"
    (d / "model").mkdir(parents=True)
    (d / "model" / "w.bin").write_bytes(b"w")
    (d / "checkpoints" / "step-00000002").mkdir(parents=True)
    (d / "checkpoints" / "step-00000002" / "w.bin").write_bytes(b"c")
    t0 = time.time() - 100
    started = {"key": "k", "t0": t0}
    done = cache.write_done(d, "k", {}, {}, 1.0, None, "run")
    assert done["outputs"] == {"model/w.bin": cache.digest_file(d / "model" / "w.bin")}
    assert done["files"] == ["checkpoints/step-00000002/w.bin"]
    (d / "notes.txt").write_text("mine")
    assert foreign_files(d, done, started) == [d / "notes.txt"]
    # a run that stopped before its DONE.json: files written since it started are its own, older ones are not
    (d / "DONE.json").unlink()
    old = d / "old.txt"
    old.write_text("older than the run")
    os.utime(old, (t0 - 3600, t0 - 3600))
    assert foreign_files(d, None, started) == [old]
    assert foreign_files(d, None, None) == sorted(p for p in d.rglob("*") if p.is_file())  # nothing vouched for


# ---------------------------------------------------------------------------------------------
# 4. a stage is reused only while its outputs are what it wrote


def test_a_deleted_model_reruns_its_stage_instead_of_failing_forever(run, copy, capsys):
    from safetensors.torch import load_file

    out, _ = run
    shutil.rmtree(copy / "sft" / "model")
    plan = run_pipeline(micro(), copy, quiet=True, explain=True)["explain"]
    text = capsys.readouterr().out
    assert plan["sft"] == "run" and "sft: run (its outputs changed since it ran: model/config.json missing" in text
    only = run_pipeline(micro(), copy, quiet=True, explain=True, only=("sft",))["explain"]
    assert only["sft"] == "run"  # --only sft notices too
    capsys.readouterr()
    res = run_pipeline(micro(), copy, quiet=True, only=("grpo",))  # sft outside --only: grpo cannot use it
    assert statuses(res)["sft"] == "skipped" and statuses(res)["grpo"] == "skipped"
    assert "not run (not in --only; changed earlier result: its outputs changed" in capsys.readouterr().out
    res = run_pipeline(micro(), copy, quiet=True)
    st = statuses(res)
    # the stages after it read a new run's checkpoint (its run id differs), so they run again, from the same weights
    assert st["sft"] == "ran" and {st[s] for s in AFTER_SFT} == {"ran"}
    for stage in ("sft", *AFTER_SFT):
        a, b = (load_file(d / stage / "model" / "model.safetensors") for d in (out, copy))
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a), stage
    assert res["heldout"] == run[1]["heldout"]
    assert {v["status"] for v in run_pipeline(micro(), copy, quiet=True)["stages"].values()} <= {"cached", "skipped"}


def test_edited_weights_and_an_appended_line_are_not_reused(run, copy, capsys):
    out, _ = run
    w = copy / "sft" / "model" / "model.safetensors"
    raw = bytearray(w.read_bytes())
    raw[-1] ^= 0xFF  # one weight's last byte
    w.write_bytes(bytes(raw))
    with open(copy / "dedup" / "kept.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"id": "x", "text": "1+1=3"}) + "\n")
    plan = run_pipeline(micro(), copy, quiet=True, explain=True)["explain"]
    text = capsys.readouterr().out
    assert plan["dedup"] == "run" and "dedup: run (its outputs changed since it ran: kept.jsonl modified)" in text
    res = run_pipeline(micro(), copy, quiet=True)
    assert statuses(res)["dedup"] == "ran" and statuses(res)["sft"] == "ran"
    for rel in ("dedup/kept.jsonl", "sft/model/model.safetensors"):
        assert (copy / rel).read_bytes() == (out / rel).read_bytes(), rel  # the edits are gone, the result is the run's
    assert res["heldout"] == run[1]["heldout"]


def test_path_valued_options_are_keyed_by_their_contents(run, tmp_path):
    """``[sft] init`` and ``[grpo] reward_model`` name checkpoints: a moved one keeps the key, an edited one not."""
    from posttrain.trainers.pg_config import PolicyGradientConfig
    from posttrain.trainers.sft import SFTConfig

    out, _ = run
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(out / "rm" / "model", a)
    for cls, field in ((SFTConfig, "init"), (PolicyGradientConfig, "reward_model")):

        def fields(path, cls=cls, field=field):
            return cache.key_fields("s", cls(**{field: str(path)}), {}, {}, 0)

        first = fields(a)
        shutil.copytree(a, b)
        assert cache.key_of(fields(b)) == cache.key_of(first)  # another path, the same bytes: the same key
        head = b / "reward_head.safetensors"
        raw = bytearray(head.read_bytes())
        raw[-4:] = bytes(x ^ 0x80 for x in raw[-4:])  # a float's sign bit: the head negated in part
        head.write_bytes(bytes(raw))
        edited = fields(b)
        assert cache.key_of(edited) != cache.key_of(first)
        assert cache.changed_fields(first, edited) == [f"inputs.config.{field} changed"]
        shutil.rmtree(b)


def test_a_negated_reward_model_reruns_grpo(run, copy, capsys):
    from safetensors.torch import load_file, save_file

    rm = copy.parent / "rm_copy"
    shutil.copytree(copy / "rm" / "model", rm)
    cfg = micro(**{"grpo.reward_model": str(rm)})
    assert statuses(run_pipeline(cfg, copy, quiet=True, only=("grpo",)))["grpo"] == "ran"
    assert run_pipeline(cfg, copy, quiet=True, explain=True)["explain"]["grpo"] == "cached"
    head = load_file(rm / "reward_head.safetensors")
    save_file({k: -v for k, v in head.items()}, rm / "reward_head.safetensors")
    capsys.readouterr()
    assert run_pipeline(cfg, copy, quiet=True, explain=True)["explain"]["grpo"] == "run"
    assert "grpo: run (inputs.config.reward_model changed)" in capsys.readouterr().out


REWARD = "def fn(prompts, completions, **columns):\n    return [float(len(c) % {m}) for c in completions]\n"


def test_a_module_reward_in_the_working_directory_is_keyed_by_its_source(tmp_path):
    """`--reward mymod:fn` with mymod.py in the current directory, run as the `posttrain` command runs (the current
    directory not on sys.path at start): unchanged -> cached; edited -> grpo and eval run again."""
    (tmp_path / "mymod.py").write_text(REWARD.format(m=2))
    out = tmp_path / "P"
    only = ["--only", "dedup", "tokenizer", "sft", "grpo", "eval"]

    def cli(*extra):
        argv = [sys.executable, "-P", "-m", "posttrain", "pipeline", "--preset", "micro", "--quiet", "--out", str(out)]
        argv += ["--reward", "mymod:fn", *only, *extra]
        proc = subprocess.run(argv, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    cli()
    for stage in ("grpo", "eval"):
        assert "reward.mymod:fn" in cache.read_done(out / stage)["fields"]["inputs"], stage
    plan = cli("--explain")
    assert "grpo: cached" in plan and "eval: cached" in plan, plan
    (tmp_path / "mymod.py").write_text(REWARD.format(m=3))
    plan = cli("--explain")
    assert "grpo: run (inputs.reward.mymod:fn changed)" in plan and "eval: run" in plan, plan


# ---------------------------------------------------------------------------------------------
# 5. one writer per directory, and no worker outlives the pipeline


def test_a_second_run_into_a_locked_directory_is_one_line_naming_the_holder(copy, capsys):
    holder = Holder(copy)
    try:
        before = snapshot(copy)
        rc, err = pipeline_cli(capsys, copy)
        assert rc == 2 and err == (
            f"posttrain pipeline: error: {copy} is in use by another posttrain process (pid {holder.pid}): wait for it to finish, "
            f"or stop it"
        )
        assert snapshot(copy) == before
    finally:
        holder.kill()  # kill -9: the kernel drops the lock with the process
    check_free(copy)
    assert statuses(run_pipeline(micro(), copy, quiet=True))["sft"] == "cached"


def test_a_stage_directory_a_leftover_worker_still_writes_is_not_cleared(copy, capsys):
    shutil.rmtree(copy / "sft" / "model")  # sft must run again
    holder = Holder(copy / "sft")  # a worker of a killed pipeline, still training in sft/
    try:
        before = snapshot(copy / "sft")
        rc, err = pipeline_cli(capsys, copy)
        assert rc == 2 and f"{copy / 'sft'} is in use by another posttrain process (pid {holder.pid})" in err
        assert snapshot(copy / "sft") == before
    finally:
        holder.kill()


def _children(pid: int) -> set[int]:
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out |= {int(x) for x in (task / "children").read_text().split()}
        except FileNotFoundError:
            pass  # a thread that has just ended
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux")
def test_killing_the_pipeline_kills_its_workers_and_a_rerun_can_write(tmp_path):
    out = tmp_path / "P"
    cfg = _toml(tmp_path / "long.toml", "[sft]\nsteps = 1000000\nsave_every = 0\neval_every = 0\n")
    argv = [sys.executable, "-m", "posttrain", "pipeline", "--preset", "micro", "--quiet", "--jobs", "2"]
    proc = subprocess.Popen([*argv, "--config", str(cfg), "--out", str(out)], env=ENV, stdout=subprocess.DEVNULL)
    workers: set[int] = set()
    try:
        deadline = time.time() + 240
        while not any((out / "sft").rglob("run.json")):  # a worker has begun writing sft/
            assert proc.poll() is None and time.time() < deadline, "the sft worker never started"
            time.sleep(0.2)
        workers = {p for p in _children(proc.pid) if _alive(p)}
        assert workers and holder_pid(out) == proc.pid
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.time() + 30
        while any(_alive(p) for p in workers) and time.time() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in workers), "a worker outlived the pipeline"
    finally:
        for p in workers:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    for d in (out, out / "sft", *(p.parent for p in (out / "sft").rglob("run.json"))):
        check_free(d)  # every lock went with its process


def test_an_error_in_the_runner_kills_the_running_workers(copy):
    """With jobs 2 the sft worker is running when sft_raw's directory turns out to hold a file of the user's: the
    command fails at once, kills the worker (nothing goes on writing sft/), and a later run completes."""
    (copy / "sft_raw" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="sft_raw/notes.txt was not written by the pipeline"):
        run_pipeline(micro(jobs=2, **{"sft.steps": 25}), copy, quiet=True)
    left = {p: _cmdline(p) for p in _children(os.getpid()) if _alive(p)}
    assert not {p: c for p, c in left.items() if "spawn_main" in c}, left  # no worker left running
    assert not (copy / "sft" / cache.DONE_FILE).exists()  # failed at once: sft was not trained on behind its back
    check_free(copy / "sft")
    (copy / "sft_raw" / "notes.txt").unlink()
    res = run_pipeline(micro(**{"sft.steps": 25}), copy, quiet=True)
    assert statuses(res)["sft"] in ("ran", "resumed") and statuses(res)["sft_raw"] == "ran"
