"""The sandbox contains runaway code: loops, memory hogs, child processes, output floods, env and cwd leaks.

Limits are kept small (1-2 s) so the file runs in a few seconds. The process test spawns a BOUNDED number of
children (never a fork bomb: as root RLIMIT_NPROC is not enforced).
"""

import os
import time

import pytest

from posttrain.rewards.sandbox import run_python


def _alive(pid: int) -> bool:
    """True if ``pid`` is a live (non-zombie) process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _wait_dead(pids, timeout=3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_correct_program_runs():
    r = run_python("import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))", stdin="2 3 4", wall_timeout_s=10)
    assert r.status == "ok" and r.stdout.strip() == "9" and r.returncode == 0


def test_infinite_loop_is_killed_at_the_wall_limit():
    t = time.monotonic()
    r = run_python("while True:\n    pass", wall_timeout_s=1.0)
    assert r.status == "timeout"
    assert time.monotonic() - t < 5.0  # 1 s limit + process start/kill, generous for a loaded machine


def test_cpu_limit_kills_a_busy_loop_even_with_a_long_wall_limit():
    r = run_python("while True:\n    pass", wall_timeout_s=30.0, cpu_time_s=1)
    assert r.status == "timeout" and r.wall_s < 20.0  # SIGXCPU after ~1 s of CPU, not the 30 s wall


def test_sleeping_program_is_killed():
    r = run_python("import time\ntime.sleep(60)", wall_timeout_s=1.0)
    assert r.status == "timeout" and r.wall_s < 5.0


@pytest.mark.parametrize("code", ["x = bytearray(8 * 1024**3)", "xs = []\nwhile True:\n    xs.append(bytearray(10**7))"])
def test_memory_hog_hits_the_address_space_limit(code):
    r = run_python(code, wall_timeout_s=10.0, memory_mb=256)
    assert r.status == "memory", (r.status, r.stderr[-300:])
    assert r.wall_s < 8.0


def test_output_flood_is_capped():
    r = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 4096)", wall_timeout_s=5.0, max_output_bytes=10_000)
    assert r.status == "output_limit" and len(r.stdout) <= 10_000


def test_writing_big_files_is_capped_and_cwd_is_a_fresh_temp_dir():
    code = "import os\nprint(os.getcwd())\nopen('big', 'wb').write(b'x' * 10**6)"
    r = run_python(code, wall_timeout_s=10.0, max_output_bytes=10_000)
    cwd = r.stdout.splitlines()[0]
    assert r.status == "output_limit" and cwd != os.getcwd() and "posttrain-sandbox-" in cwd
    assert not os.path.exists(cwd)  # removed afterwards


def test_environment_is_scrubbed():
    os.environ["POSTTRAIN_SECRET_TEST"] = "hunter2"
    try:
        r = run_python("import os\nprint(sorted(os.environ))", wall_timeout_s=10.0)
    finally:
        del os.environ["POSTTRAIN_SECRET_TEST"]
    assert r.ok and "POSTTRAIN_SECRET_TEST" not in r.stdout and "hunter2" not in r.stdout
    assert set(eval(r.stdout)) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL"}  # our own output, a list literal


_SPAWN = """
import os, sys, time
pids = []
for _ in range(20):
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    pids.append(pid)
print(" ".join(map(str, pids)), flush=True)
{tail}
"""


@pytest.mark.parametrize("tail", ["time.sleep(60)", "sys.exit(0)"], ids=["parent_hangs", "parent_exits"])
def test_the_whole_process_group_dies(tail):
    """20 sleeping children: whether the parent hangs (timeout) or exits at once, none may survive."""
    r = run_python(_SPAWN.format(tail=tail), wall_timeout_s=2.0)
    pids = [int(p) for p in r.stdout.split()]
    assert len(pids) == 20, (r.status, r.stderr[-300:])
    assert r.status == ("timeout" if "sleep" in tail else "ok")
    assert _wait_dead(pids) == []


def test_syntax_error_and_exceptions_are_errors_not_crashes():
    assert run_python("def f(:", wall_timeout_s=10).status == "error"
    r = run_python("raise RuntimeError('boom')", wall_timeout_s=10)
    assert r.status == "error" and "boom" in r.stderr
    assert run_python("raise SystemExit(3)", wall_timeout_s=10).returncode == 3


def test_missing_interpreter_is_reported_not_raised():
    r = run_python("print(1)", python="/nonexistent/python")
    assert r.status == "crashed"
