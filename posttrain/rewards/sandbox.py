"""Run untrusted Python (a model's completion) in an isolated, resource-limited child that can never hang the trainer.

Key insight: the trainer only ever *waits* on the child, with a deadline, and then kills it, so nothing the
code does — loop forever, allocate without bound, fork, flood stdout — outlives ``wall_timeout_s``; and
under bubblewrap (the default) the child is an unprivileged user (uid/gid 65534, no capabilities) in its own
user, PID, mount, network, IPC and UTS namespaces, so it cannot see the trainer at all:

    child  = bwrap ... python -I -c DROP + PRELUDE  in per-run cgroups   (layout: posttrain.rewards.isolation)
    DROP   : become uid/gid 65534 with empty capability sets, or exit before reading the code
    PRELUDE: setrlimit(AS = memory, CPU = cpu seconds, FSIZE = output cap, CORE = 0, NPROC) -> exec(main.py)
    parent : wait(wall_timeout_s) -> os.killpg(group, SIGKILL) always (also after a normal exit: orphans die)
    stdin/stdout/stderr are anonymous temp files (no path); RLIMIT_FSIZE caps them, we read back <= the cap

What bwrap mode contains (tests/rewards/test_sandbox_escapes_*.py try each, with the trainer as root and as
an ordinary user): root's powers (the code is uid 65534 with every capability set empty and ``no_new_privs``,
also when the trainer is root: it cannot write ``/proc/sys`` — read-only besides — or ``/sys``, nor read
``/etc/shadow``, which is also hidden, or root's files), signals to the trainer (its PID is not in the
child's namespace; ``getppid()`` is bwrap's init), writes and deletes outside the work dir (read-only root;
/tmp, /var/tmp, /run, /root, /home and ~ — with the trainer's ``~/.ssh`` and other secrets — are private,
size-capped tmpfs), the trainer's environment (``--clearenv``, and no ``/proc/<pid>/environ`` of any outside
process), the network (a fresh network namespace: loopback only, and not the host's), system calls for
debugging, mounts, namespaces, kernel keys, bpf, perf events, modules and the like (a seccomp filter:
posttrain.rewards.seccomp; they fail with EPERM), a ``setsid()`` child (the whole PID namespace dies with
bwrap, which has ``--die-with-parent``), a fork bomb (a pids cgroup where /sys/fs/cgroup allows one, and
RLIMIT_NPROC, enforced now that the code is not root) and memory spread over many processes (a memory cgroup
of ``memory_mb`` plus the /tmp size over all of them, where one can be had: posttrain.rewards.cgroups; its
OOM kills report status "memory"). It does not hide world-readable files under the read-only root, nor, when
the trainer is not root, what the trainer's own user and groups may read there; it does not stop kernel bugs
reachable through the allowed system calls.

The rlimit-only mode (``isolation="rlimit"``, an explicit opt-in with a WeakSandboxWarning) runs the same
prelude (without DROP) in a temp dir with a scrubbed environment, its own session and the same cgroups, and
nothing more: there the code runs as the trainer's user (root, if the trainer is root) and CAN signal and
kill the trainer, read and write the user's files, read ``/proc/<ppid>/environ``, use the network, and leave
the process group with ``setsid()`` before the kill. It guards against buggy or runaway code only.

The limits are set by the child on itself before the untrusted code runs (no ``preexec_fn``, which is unsafe
in a multi-threaded trainer). ``-I`` ignores PYTHON* variables and the user site.
"""

from __future__ import annotations

import dataclasses
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from posttrain.rewards import cgroups
from posttrain.rewards.isolation import DROP, WORKDIR, resolve_isolation, sandbox_env, start_bwrap

_DEFAULT_PROCESSES = 64
_PRELUDE = """\
import resource, sys
def _lim(name, soft, hard=None):
    try:
        resource.setrlimit(getattr(resource, name), (soft, soft if hard is None else hard))
    except (ValueError, OSError):
        pass
_lim("RLIMIT_AS", {memory})
_lim("RLIMIT_CPU", {cpu}, {cpu_hard})
_lim("RLIMIT_FSIZE", {fsize})
_lim("RLIMIT_CORE", 0)
{nproc}
del _lim, resource
sys.argv = ["main.py"]
with open("main.py", encoding="utf-8") as _f:
    _code = compile(_f.read(), "main.py", "exec")
del _f
exec(_code, {{"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}})
"""


@dataclasses.dataclass
class SandboxResult:
    """Outcome of one sandboxed run.

    status: "ok" (exit 0), "error" (non-zero exit / exception), "timeout" (wall or CPU limit),
    "memory" (MemoryError or killed at the address-space limit), "output_limit" (wrote past the cap),
    "crashed" (the sandbox itself could not start the child).
    """

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _read_capped(f, cap: int) -> str:
    try:
        f.seek(0)
        return f.read(cap).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the child leads its own session, so its pgid == its pid
    except (ProcessLookupError, PermissionError):
        pass


def _wait_exit(proc: subprocess.Popen, timeout: float) -> bool:
    """True if ``proc`` exited within ``timeout`` s. A pidfd wakes us at the exit; Popen.wait(timeout) polls
    with sleeps of up to 50 ms, which was most of the cost of a short run."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            deadline = time.monotonic() + timeout
            while proc.poll() is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                poller.poll(max(1, int(left * 1000)))
            return True
        finally:
            os.close(fd)
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def _classify(returncode: int, timed_out: bool, stderr: str, mode: str = "rlimit") -> str:
    if mode == "bwrap" and returncode == 1 and stderr.startswith("bwrap: "):
        return "crashed"  # bwrap itself could not set the sandbox up
    if timed_out or returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "timeout"
    if returncode == -signal.SIGXFSZ or "File too large" in stderr[-2000:]:  # Python ignores SIGXFSZ: EFBIG
        return "output_limit"
    if returncode == 0:
        return "ok"
    if "MemoryError" in stderr[-2000:] or (
        returncode in (-signal.SIGSEGV, -signal.SIGABRT) and "memory" in stderr.lower()
    ):
        return "memory"
    return "error"


def run_python(
    code: str,
    *,
    stdin: str = "",
    wall_timeout_s: float = 2.0,
    cpu_time_s: int | None = None,
    memory_mb: int = 256,
    max_output_bytes: int = 1 << 16,
    max_processes: int | None = None,
    python: str = sys.executable,
    isolation: str | None = None,
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a sandboxed child Python; never raises for anything the code does.

    wall_timeout_s: the deadline for the whole process group (killed with SIGKILL at expiry).
    cpu_time_s: RLIMIT_CPU (default: ceil(wall_timeout_s)). memory_mb: RLIMIT_AS. max_output_bytes:
    RLIMIT_FSIZE, which caps stdout, stderr and any file the code writes. max_processes (default 64): the
    processes and threads the code may have — a pids cgroup where one can be made, and RLIMIT_NPROC under
    bwrap (counted in its own user namespace, for uid 65534) or when given in rlimit mode (counted per user,
    ignored for root). A memory cgroup, where one can be made, caps all the run's processes together at
    ``memory_mb`` plus the size of its /tmp. isolation: "auto" | "bwrap" | "rlimit" (None:
    ``$POSTTRAIN_SANDBOX`` or "auto");
    raises UserError when bwrap is required and does not work here (see posttrain.rewards.isolation).
    """
    mode = resolve_isolation(isolation)
    nproc = max_processes if (max_processes is not None or mode == "rlimit") else _DEFAULT_PROCESSES
    cpu = max(1, int(math.ceil(cpu_time_s if cpu_time_s is not None else wall_timeout_s)))
    prelude = _PRELUDE.format(
        memory=int(memory_mb) << 20,
        cpu=cpu,
        cpu_hard=cpu + 1,
        fsize=int(max_output_bytes),
        nproc=f'_lim("RLIMIT_NPROC", {int(nproc)})' if nproc else "",
    )
    start = time.monotonic()
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        return SandboxResult("crashed", None, "", f"could not start the sandbox: no executable {python}", 0.0)
    tmp = tempfile.mkdtemp(prefix="posttrain-sandbox-")
    run_cgroups: list[str] = []
    try:
        main_py = os.path.join(tmp, "main.py")
        with open(main_py, "w", encoding="utf-8") as f:
            f.write(code)
        os.chmod(main_py, 0o644)  # read by uid 65534 inside bwrap (the directory stays 0700)
        tmpfs_bytes = max(16 << 20, 4 * int(max_output_bytes))
        # the memory cgroup caps all the run's processes together, with the files it writes in its tmpfs
        run_cgroups = cgroups.make_run_cgroups(nproc or _DEFAULT_PROCESSES, (int(memory_mb) << 20) + tmpfs_bytes)
        # Anonymous files (no name in the work dir): the code cannot find its own stdin/stdout by path.
        with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
            fin.write(stdin.encode("utf-8"))
            fin.seek(0)
            try:
                if mode == "bwrap":
                    proc = start_bwrap(
                        [python, "-I", "-c", DROP + prelude],
                        main_py=main_py,
                        tmpfs_bytes=tmpfs_bytes,
                        cgroup_paths=run_cgroups,
                        setup_timeout_s=max(5.0, wall_timeout_s),
                        cwd=tmp,
                        env=sandbox_env(WORKDIR),
                        stdin=fin,
                        stdout=fout,
                        stderr=ferr,
                    )
                else:
                    argv = [python, "-I", "-c", prelude]
                    if run_cgroups:
                        argv = cgroups.join_cgroup_argv(run_cgroups, argv)
                    proc = subprocess.Popen(
                        argv,
                        cwd=tmp,
                        env=sandbox_env(tmp),
                        stdin=fin,
                        stdout=fout,
                        stderr=ferr,
                        start_new_session=True,
                        close_fds=True,
                    )
            except OSError as e:
                return SandboxResult("crashed", None, "", f"could not start the sandbox: {e}", time.monotonic() - start)
            try:
                timed_out = not _wait_exit(proc, wall_timeout_s)
            finally:
                _kill_group(proc.pid)  # always: also reaps children left behind by a normal exit
                proc.wait()
            stdout = _read_capped(fout, max_output_bytes)
            stderr = _read_capped(ferr, max_output_bytes)
        oom = sum(cgroups.oom_kills(path) for path in run_cgroups)
        rc = proc.returncode
        if mode == "bwrap" and rc is not None and 128 < rc < 128 + 65:
            rc = 128 - rc  # bwrap reports a child killed by signal N as exit 128+N: make it -N, as Popen does
        status = _classify(rc, timed_out, stderr, mode)
        if oom and status in ("timeout", "error"):
            status = "memory"  # the memory cgroup's OOM killer ended it
        return SandboxResult(status, rc, stdout, stderr, time.monotonic() - start)
    finally:
        for path in run_cgroups:
            cgroups.remove_cgroup(path)
        shutil.rmtree(tmp, ignore_errors=True)
