"""The sandbox contains runaway code: loops, memory hogs, child processes, output floods, env and cwd leaks.

Every test runs in both isolation modes: "bwrap" (skipped, saying so, where bubblewrap does not work) and the
opt-in "rlimit" mode. Limits are kept small (1-2 s) so the file runs in a few seconds. The process test
spawns a BOUNDED number of children (the fork bomb is in test_sandbox_escapes_processes.py). Escapes are in
test_sandbox_escapes_files.py (files, environment, network), test_sandbox_escapes_processes.py (signals, children,
resources, the refusal without bubblewrap) and test_sandbox_escapes_privileges.py (uid, capabilities, /proc/sys,
system calls).
"""

import errno
import functools
import os
import re
import struct
import time
import warnings

import pytest

from posttrain.rewards import sandbox as sandbox_module
from posttrain.rewards import seccomp
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


# ------------------------------------------------------------------------------------------- seccomp filter


def _run_bpf(prog: bytes, nr: int, arch: int, arg0: int = 0) -> int:
    """A classic-BPF interpreter (the few opcodes a seccomp filter uses) over one struct seccomp_data."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    insns = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35, 0x45):  # jeq, jge, jset
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


@pytest.mark.parametrize("arch", sorted(seccomp.SYSCALLS))
def test_seccomp_filter_refuses_exactly_the_listed_calls(arch):
    """Every syscall number, both ABIs: the program agrees with the plain statement of the policy."""
    prog, nrs, me = seccomp.build_filter(arch), seccomp.SYSCALLS[arch], seccomp.AUDIT_ARCH[arch]
    refused = {nrs[n] for n in seccomp.REFUSED if n in nrs}
    eperm, enosys = seccomp.RET_ERRNO | errno.EPERM, seccomp.RET_ERRNO | errno.ENOSYS
    for nr in range(600):
        want = eperm if nr in refused else enosys if nr == nrs["clone3"] else seccomp.RET_ALLOW
        assert _run_bpf(prog, nr, me) == want, nr
    assert _run_bpf(prog, nrs["clone"], me, arg0=0x01200011) == seccomp.RET_ALLOW  # fork()'s flags
    for flag in (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000):
        assert _run_bpf(prog, nrs["clone"], me, arg0=flag | 0x11) == eperm  # CLONE_NEW*
    other = next(a for a in seccomp.AUDIT_ARCH.values() if a != me)
    for foreign in (0x40000003, other):  # i386 (int 0x80), the other machine
        assert _run_bpf(prog, 0, foreign) == seccomp.RET_KILL_PROCESS
    if arch == "x86_64":
        assert _run_bpf(prog, 0x40000000 | 0, me) == seccomp.RET_KILL_PROCESS  # x32


@pytest.mark.parametrize(
    "arch,header,pattern",
    [
        ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", r"#define __NR_(\w+)\s+(\d+)"),
        ("x86_64", "/usr/include/asm/unistd_64.h", r"#define __NR_(\w+)\s+(\d+)"),
        ("aarch64", "/usr/include/asm-generic/unistd.h", r"#define __NR(?:3264)?_(\w+)\s+(\d+)"),
    ],
)
def test_seccomp_syscall_numbers_match_the_kernel_headers(arch, header, pattern):
    if not os.path.exists(header):
        pytest.skip(f"{header} is not installed")
    with open(header) as f:
        numbers = {name: int(nr) for name, nr in re.findall(pattern, f.read())}
    assert {n: numbers.get(n) for n in seccomp.SYSCALLS[arch]} == seccomp.SYSCALLS[arch]
