"""Escapes from the sandbox, each tried against bwrap mode (must fail) and against the rlimit opt-in.

Every attack targets a *victim* the test owns (a sleeping process, a file, a listening socket), never the test
process itself, so a successful escape shows up as a failed assertion, not a dead pytest. Running the same
attack in rlimit mode, where the module docstring says it succeeds, proves each attack is real: a test that
only ever sees "contained" could not tell a working sandbox from a broken attack.

bwrap tests are skipped (saying why) where bubblewrap does not work; the refusal path is tested everywhere.
"""

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings

import pytest

from posttrain.errors import ConfigError, UserError
from posttrain.rewards import isolation
from posttrain.rewards.registry import get_reward
from posttrain.rewards.sandbox import run_python
from posttrain.rewards.verifiers import make_code_reward

HAVE_BWRAP = isolation.bwrap_problem() is None
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason=f"bubblewrap unavailable: {isolation.bwrap_problem()}")
MODES = [pytest.param("bwrap", marks=needs_bwrap), "rlimit"]


@pytest.fixture(autouse=True)
def _quiet_rlimit_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", isolation.WeakSandboxWarning)
        yield


def _run(code: str, mode: str, **kw):
    r = run_python(code, isolation=mode, wall_timeout_s=kw.pop("wall_timeout_s", 5.0), **kw)
    assert r.status in ("ok", "timeout"), (r.status, r.stderr[-500:])
    return r


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.fixture
def victim():
    """A sleeping process with a secret in its environment (visible in its /proc/<pid>/environ)."""
    secret = "s3cret-" + secrets.token_hex(8)
    proc = subprocess.Popen(["sleep", "60"], env={"PATH": "/usr/bin:/bin", "POSTTRAIN_VICTIM_SECRET": secret})
    yield proc, secret
    proc.kill()
    proc.wait()


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
    r = _run(code, mode)
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    time.sleep(0.05)
    if mode == "bwrap":
        assert lines == {"ppid": "1", str(proc.pid): "ProcessLookupError", str(os.getpid()): "ProcessLookupError"}
        assert _alive(proc.pid) and proc.poll() is None
    else:  # documented: the rlimit mode cannot stop it
        assert lines == {"ppid": str(os.getpid()), str(proc.pid): "reached", str(os.getpid()): "reached"}
        proc.wait(timeout=5)
        assert proc.returncode == -signal.SIGKILL


# ------------------------------------------------------------------------------------------- files


@pytest.mark.parametrize("mode", MODES)
def test_cannot_write_or_delete_files_outside(mode, tmp_path):
    # A directory the sandbox can SEE, and one under /tmp (hidden). The interpreter's prefix is visible
    # wherever the checkout lives (bound back read-only when it is under /tmp or a home directory); the
    # checkout itself is not: a clone under /tmp is hidden by the sandbox's private /tmp.
    visible = tempfile.mkdtemp(prefix="escape-", dir=sys.prefix)
    os.chmod(visible, 0o755)  # readable by anyone: the sandbox's uid 65534 sees it
    try:
        target, sibling = os.path.join(visible, "keep.txt"), os.path.join(visible, "new.txt")
        hidden = tmp_path / "hidden.txt"
        for p in (target, hidden):
            with open(p, "w") as f:
                f.write("original")
            os.chmod(p, 0o644)
        code = f"""
import os
print("sees", os.path.exists({target!r}), os.path.exists({str(hidden)!r}))
for name, act in (("delete", lambda: os.remove({target!r})), ("write", lambda: open({sibling!r}, "w").write("x")),
                  ("overwrite", lambda: open({target!r}, "w").write("pwned"))):
    try:
        act()
        print(name, "done")
    except OSError as e:
        print(name, type(e).__name__, e.errno)
"""
        out = _run(code, mode).stdout.splitlines()
        if mode == "bwrap":
            assert out == ["sees True False", "delete OSError 30", "write OSError 30", "overwrite OSError 30"]  # EROFS
            assert open(target).read() == "original" and not os.path.exists(sibling)
        else:  # documented: the rlimit mode cannot stop it
            assert out == ["sees True True", "delete done", "write done", "overwrite done"]
            assert open(target).read() == "pwned" and os.path.exists(sibling)
        assert hidden.read_text() == "original"
    finally:
        for name in os.listdir(visible):
            os.remove(os.path.join(visible, name))
        os.rmdir(visible)


# ------------------------------------------------------------------------------------------- environment

_FIND_SECRET = """
import os
found = [k for k, v in os.environ.items() if {secret!r} in v or k in {names!r}]
for pid in [p for p in os.listdir("/proc") if p.isdigit()] + [{victim_pid!r}, {trainer_pid!r}]:
    try:
        with open(f"/proc/{{pid}}/environ", "rb") as f:
            if {secret!r}.encode() in f.read():
                found.append(pid)
    except OSError:
        pass
print(sorted(set(found)))
"""


@pytest.mark.parametrize("mode", MODES)
def test_cannot_read_the_environment_of_the_trainer_or_other_processes(mode, victim, monkeypatch):
    proc, secret = victim
    monkeypatch.setenv("POSTTRAIN_TRAINER_SECRET", secret)
    code = _FIND_SECRET.format(
        secret=secret,
        names=["POSTTRAIN_TRAINER_SECRET", "POSTTRAIN_VICTIM_SECRET"],
        victim_pid=str(proc.pid),
        trainer_pid=str(os.getpid()),
    )
    # The same search run here, outside any sandbox, finds the victim: the probe itself works.
    found_here = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert str(proc.pid) in found_here and "POSTTRAIN_TRAINER_SECRET" in found_here
    out = _run(code, mode).stdout.strip()
    assert out == ("[]" if mode == "bwrap" else repr([str(proc.pid)]))  # rlimit: env scrubbed, /proc still open


# ------------------------------------------------------------------------------------------- network


@pytest.mark.parametrize("mode", MODES)
def test_no_network(mode):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        port = server.getsockname()[1]
        code = f"""
import socket
for what, act in (("local", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=1)),
                  ("outward", lambda: socket.create_connection(("1.1.1.1", 53), timeout=1)),
                  ("dns", lambda: socket.getaddrinfo("example.com", 80))):
    try:
        act()
        print(what, "connected")
    except OSError as e:
        print(what, type(e).__name__)
"""
        out = _run(code, mode).stdout.splitlines()
        if mode == "bwrap":
            assert out == ["local ConnectionRefusedError", "outward OSError", "dns gaierror"]
            with pytest.raises(TimeoutError):
                server.accept()  # nobody ever reached the trainer's port
        else:  # documented: the rlimit mode cannot stop it
            assert out[0] == "local connected"
            server.accept()[0].close()


# ------------------------------------------------------------------------------------------- processes


def _sleepers(marker: str) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read() == b"sleep\0" + marker.encode() + b"\0" and _alive(int(pid)):
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
    assert _run(code, mode).stdout == "forked\n"
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
    r = _run(count, "bwrap", max_processes=16, wall_timeout_s=5.0)
    assert 0 < int(r.stdout) < 16 and _gone(marker)  # 16 pids include bwrap, its init and python
    t = time.monotonic()
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_python(bomb, isolation="bwrap", max_processes=16, wall_timeout_s=1.0)
    assert r.status == "timeout" and time.monotonic() - t < 4.0
    assert subprocess.run(["true"]).returncode == 0  # the machine can still fork


# ------------------------------------------------------------------------------------------- the refusal


@pytest.fixture
def no_bwrap(monkeypatch):
    monkeypatch.setattr(isolation, "find_bwrap", lambda: None)
    monkeypatch.delenv(isolation.ENV_VAR, raising=False)
    isolation.bwrap_problem.cache_clear()
    yield
    monkeypatch.undo()
    isolation.bwrap_problem.cache_clear()


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
