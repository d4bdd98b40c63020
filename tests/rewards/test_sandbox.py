"""The sandbox contains runaway code: loops, memory hogs, child processes, output floods, env and cwd leaks.

Every test runs in both isolation modes: "bwrap" (skipped, saying so, where bubblewrap does not work) and the
opt-in "rlimit" mode. Limits are kept small (1-2 s) so the file runs in a few seconds. The process test
spawns a BOUNDED number of children (the fork bomb is in test_sandbox_escapes.py). Escapes (signals to the
trainer, files, environment, network) are in test_sandbox_escapes.py.
"""

import functools
import os
import time
import warnings

import pytest

from posttrain.rewards import sandbox as sandbox_module
from posttrain.rewards.isolation import WORKDIR, WeakSandboxWarning, bwrap_problem


@pytest.fixture(params=["bwrap", "rlimit"])
def run_python(request):
    """run_python with the isolation mode fixed (the rlimit warning is expected, and silenced here)."""
    if request.param == "bwrap" and bwrap_problem() is not None:
        pytest.skip(f"bubblewrap unavailable: {bwrap_problem()}")
    fn = functools.partial(sandbox_module.run_python, isolation=request.param)
    fn.mode = request.param
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WeakSandboxWarning)
        yield fn


def _alive(pid: int) -> bool:
    """True if ``pid`` is a live (non-zombie) process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_correct_program_runs(run_python):
    r = run_python("import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))", stdin="2 3 4", wall_timeout_s=10)
    assert r.status == "ok" and r.stdout.strip() == "9" and r.returncode == 0


def test_infinite_loop_is_killed_at_the_wall_limit(run_python):
    t = time.monotonic()
    r = run_python("while True:\n    pass", wall_timeout_s=0.5)
    assert r.status == "timeout"
    assert time.monotonic() - t < 5.0  # 1 s limit + process start/kill, generous for a loaded machine


def test_cpu_limit_kills_a_busy_loop_even_with_a_long_wall_limit(run_python):
    r = run_python("while True:\n    pass", wall_timeout_s=30.0, cpu_time_s=1)
    assert r.status == "timeout" and r.wall_s < 20.0  # SIGXCPU after ~1 s of CPU, not the 30 s wall


def test_sleeping_program_is_killed(run_python):
    r = run_python("import time\ntime.sleep(60)", wall_timeout_s=0.5)
    assert r.status == "timeout" and r.wall_s < 5.0


@pytest.mark.parametrize(
    "code", ["x = bytearray(8 * 1024**3)", "xs = []\nwhile True:\n    xs.append(bytearray(10**7))"]
)
def test_memory_hog_hits_the_address_space_limit(run_python, code):
    r = run_python(code, wall_timeout_s=10.0, memory_mb=256)
    assert r.status == "memory", (r.status, r.stderr[-300:])
    assert r.wall_s < 8.0


def test_output_flood_is_capped(run_python):
    r = run_python(
        "import sys\nwhile True:\n    sys.stdout.write('x' * 4096)", wall_timeout_s=5.0, max_output_bytes=10_000
    )
    assert r.status == "output_limit" and len(r.stdout) <= 10_000


def test_writing_big_files_is_capped_and_cwd_is_a_fresh_temp_dir(run_python):
    code = "import os\nprint(os.getcwd(), sorted(os.listdir('.')))\nopen('big', 'wb').write(b'x' * 10**6)"
    r = run_python(code, wall_timeout_s=10.0, max_output_bytes=10_000)
    cwd, listing = r.stdout.splitlines()[0].split(" ", 1)
    assert r.status == "output_limit" and cwd != os.getcwd() and listing == "['main.py']"  # no stdin/stdout files
    if run_python.mode == "bwrap":
        assert cwd == WORKDIR  # a private tmpfs inside the sandbox
    else:
        assert "posttrain-sandbox-" in cwd and not os.path.exists(cwd)  # a host temp dir, removed afterwards


def test_environment_is_scrubbed(run_python):
    os.environ["POSTTRAIN_SECRET_TEST"] = "hunter2"
    try:
        r = run_python("import os\nprint(sorted(os.environ))", wall_timeout_s=10.0)
    finally:
        del os.environ["POSTTRAIN_SECRET_TEST"]
    assert r.ok and "POSTTRAIN_SECRET_TEST" not in r.stdout and "hunter2" not in r.stdout
    assert set(eval(r.stdout)) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PWD"}  # our own output, a list literal


_SPAWN = """
import os, sys, time
for _ in range(20):
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", "{marker}"])
print("spawned", flush=True)
{tail}
"""


def _with_marker(marker: str) -> list[int]:
    """Host pids of live processes whose argv is ``sleep MARKER`` (a PID namespace renumbers pids, argv stays)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read() == b"sleep\0" + marker.encode() + b"\0" and _alive(int(pid)):
                    found.append(int(pid))
        except OSError:
            pass
    return found


def _wait_marker_gone(marker: str, timeout: float = 3.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _with_marker(marker):
        time.sleep(0.05)
    return _with_marker(marker)


@pytest.mark.parametrize("tail", ["time.sleep(60)", "sys.exit(0)"], ids=["parent_hangs", "parent_exits"])
def test_the_whole_process_group_dies(run_python, tail):
    """20 sleeping children: whether the parent hangs (timeout) or exits at once, none may survive."""
    marker = f"{os.getpid()}.{time.monotonic_ns() % 10**9}"  # a unique duration, e.g. "8123.456789012"
    r = run_python(_SPAWN.format(tail=tail, marker=marker), wall_timeout_s=1.0)
    assert r.stdout == "spawned\n", (r.status, r.stderr[-300:])
    assert r.status == ("timeout" if "sleep" in tail else "ok")
    assert _wait_marker_gone(marker) == []


def test_syntax_error_and_exceptions_are_errors_not_crashes(run_python):
    assert run_python("def f(:", wall_timeout_s=10).status == "error"
    r = run_python("raise RuntimeError('boom')", wall_timeout_s=10)
    assert r.status == "error" and "boom" in r.stderr
    assert run_python("raise SystemExit(3)", wall_timeout_s=10).returncode == 3


def test_missing_interpreter_is_reported_not_raised(run_python):
    r = run_python("print(1)", python="/nonexistent/python")
    assert r.status == "crashed"
