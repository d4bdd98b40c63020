"""Escapes through processes and resources: signalling processes outside, a child that outlives the run, a fork bomb,
memory summed over processes; and the refusal to run untrusted code at all where bubblewrap does not work (unless the
weaker rlimit mode is asked for). ``_escape.py`` says how each attack is made real."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posttrain.errors import ConfigError, UserError
from posttrain.rewards import cgroups, isolation
from posttrain.rewards.registry import get_reward
from posttrain.rewards.sandbox import run_python
from posttrain.rewards.verifiers import make_code_reward

sys.path.insert(0, str(Path(__file__).parent))  # the suite runs with --import-mode=importlib
from _escape import MODES, QUIET, alive, needs_bwrap, run_in  # noqa: E402

pytestmark = QUIET


# ------------------------------------------------------------------------------------------- signals


@pytest.mark.parametrize("mode", MODES)
def test_cannot_signal_processes_outside(mode, victim):
    proc, _ = victim
    code = f"""
import os, signal
print("ppid", os.getppid())
for pid in ({proc.pid}, {os.getpid()}):
    try:
        os.kill(pid, signal.SIGKILL if pid == {proc.pid} else 0)
        print(pid, "reached")
    except OSError as e:
        print(pid, type(e).__name__)
"""
    if mode == "bwrap":  # the full attack, which in rlimit mode would kill pytest itself
        code += "for pid in (os.getppid(), -1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
    r = run_in(code, mode)
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    time.sleep(0.05)
    if mode == "bwrap":
        assert lines == {"ppid": "1", str(proc.pid): "ProcessLookupError", str(os.getpid()): "ProcessLookupError"}
        assert alive(proc.pid) and proc.poll() is None
    else:  # documented: the rlimit mode cannot stop it
        assert lines == {"ppid": str(os.getpid()), str(proc.pid): "reached", str(os.getpid()): "reached"}
        proc.wait(timeout=5)
        assert proc.returncode == -signal.SIGKILL


# ------------------------------------------------------------------------------------------- processes


def _sleepers(marker: str) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read() == b"sleep\0" + marker.encode() + b"\0" and alive(int(pid)):
                    out.append(int(pid))
        except OSError:
            pass
    return out


def _gone(marker: str, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while _sleepers(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _sleepers(marker)


@pytest.mark.parametrize("mode", MODES)
def test_setsid_child_does_not_outlive_the_run(mode):
    marker = f"{os.getpid()}.{time.monotonic_ns() % 10**9}"  # a unique sleep duration to find it by argv
    code = f"""
import os
if os.fork() == 0:
    os.setsid()
    os.execv("/bin/sleep", ["sleep", "{marker}"])
print("forked")
"""
    assert run_in(code, mode).stdout == "forked\n"
    if mode == "bwrap":
        assert _gone(marker)  # the PID namespace died with bwrap
    else:  # documented: it left the process group before the kill
        time.sleep(0.2)
        survivors = _sleepers(marker)
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
        assert survivors


@needs_bwrap
def test_fork_bomb_is_bounded():
    # bounded by the pids cgroup where there is one, else by RLIMIT_NPROC (the code is uid 65534, also as root)
    marker = f"{os.getpid()}.{time.monotonic_ns() % 10**9}"
    count = f"""
import os
n = 0
while n < 1000:
    try:
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "{marker}"])
    except OSError:
        break
    n += 1
print(n, flush=True)
"""
    r = run_in(count, "bwrap", max_processes=16, wall_timeout_s=5.0)
    assert 0 < int(r.stdout) < 16 and _gone(marker)  # 16 pids include bwrap, its init and python
    t = time.monotonic()
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_python(bomb, isolation="bwrap", max_processes=16, wall_timeout_s=1.0)
    assert r.status == "timeout" and time.monotonic() - t < 4.0
    assert subprocess.run(["true"]).returncode == 0  # the machine can still fork


@needs_bwrap
def test_the_memory_cgroup_caps_all_processes_together(monkeypatch):
    if cgroups.memory_cgroup_root() is None:
        pytest.skip("no memory cgroup can be made here (no write access to a memory controller)")
    code = """
import os, time
pids = []
for _ in range(5):
    pid = os.fork()
    if pid == 0:
        x = b"\\x01" * (80 << 20)  # 80 MB, every page written
        time.sleep(1.0)
        os._exit(0)
    pids.append(pid)
print([os.waitpid(p, 0)[1] for p in pids])
"""
    # 5 x 80 MB is within every per-process limit (RLIMIT_AS 256 MB) ...
    r = run_python(code, isolation="bwrap", memory_mb=128, wall_timeout_s=20.0)
    statuses = json.loads(r.stdout) if r.status == "ok" else None
    assert statuses is None or statuses.count(0) * 80 <= 128 + 16  # the cap: memory_mb + the /tmp tmpfs
    assert statuses is None or any(os.WIFSIGNALED(s) and os.WTERMSIG(s) == signal.SIGKILL for s in statuses)
    # ... and, without the cgroup, all five hold their 80 MB together
    monkeypatch.setattr(cgroups, "memory_cgroup_root", lambda: None)
    r = run_python(code, isolation="bwrap", memory_mb=128, wall_timeout_s=20.0)
    assert r.status == "ok" and json.loads(r.stdout) == [0] * 5


# ------------------------------------------------------------------------------------------- the refusal


REFUSAL = (
    "cannot sandbox untrusted code: bwrap is not installed (no 'bwrap' on PATH); install bubblewrap "
    "(Debian/Ubuntu: apt-get install bubblewrap) or opt in to the weaker rlimit-only sandbox, which does not "
    "keep the code away from your processes, files and network, with isolation='rlimit' "
    "(CLI: POSTTRAIN_SANDBOX=rlimit)"
)


def test_without_bwrap_the_code_reward_refuses_and_names_the_opt_in(no_bwrap):
    for build in (make_code_reward, lambda: get_reward("code"), lambda: make_code_reward(isolation="bwrap")):
        with pytest.raises(UserError) as e:
            build()
        assert str(e.value) == REFUSAL
    with pytest.raises(UserError) as e:
        run_python("print(1)")
    assert str(e.value) == REFUSAL


def test_the_rlimit_opt_in_works_and_warns(no_bwrap, monkeypatch):
    tests = [["assert add(2, 3) == 5", "assert add(1, 1) == 3"]] * 2
    completions = ["def add(a, b):\n    return a + b", "def add(a, b):\n    return 0"]
    with pytest.warns(isolation.WeakSandboxWarning, match="rlimits only"):
        fn = make_code_reward(isolation="rlimit")
    assert fn(["p"] * 2, completions, tests=tests) == [0.5, 0.0]
    monkeypatch.setenv(isolation.ENV_VAR, "rlimit")  # the CLI's way in
    with pytest.warns(isolation.WeakSandboxWarning):
        assert get_reward("code")(["p"], completions[:1], tests=tests[:1]) == [0.5]
    monkeypatch.setenv(isolation.ENV_VAR, "none")
    with pytest.raises(ConfigError) as e:
        get_reward("code")
    assert str(e.value) == "sandbox POSTTRAIN_SANDBOX='none' is not valid; choose one of: auto, bwrap, rlimit"


def test_a_broken_bwrap_fails_the_self_test(monkeypatch):
    monkeypatch.setattr(isolation, "find_bwrap", lambda: "/bin/false")
    isolation.bwrap_problem.cache_clear()
    try:
        assert isolation.bwrap_problem() == "bwrap failed its self-test (exit 1: no output)"
        with pytest.raises(UserError, match="bwrap failed its self-test"):
            make_code_reward(isolation="auto")
    finally:
        monkeypatch.undo()
        isolation.bwrap_problem.cache_clear()
