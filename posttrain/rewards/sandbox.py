"""Run untrusted Python (a model's completion) in a resource-limited subprocess that can never hang the trainer.

Key insight: the trainer only ever *waits* on the child, with a deadline, and then kills the child's whole
process group, so nothing the code does — loop forever, allocate without bound, fork children, flood
stdout, write files — can outlive ``wall_timeout_s`` or touch the trainer's memory, cwd or environment:

    child = python -I -c PRELUDE   in a fresh temp dir (cwd, HOME, TMPDIR), scrubbed env, own session/group
    PRELUDE: setrlimit(AS = memory, CPU = cpu seconds, FSIZE = output cap, CORE = 0[, NPROC]) -> exec(main.py)
    parent : wait(wall_timeout_s) -> os.killpg(group, SIGKILL) always (also after a normal exit: orphans die)
    stdout/stderr go to files in the temp dir; RLIMIT_FSIZE caps them (SIGXFSZ), we read back <= the cap

The limits are set by the child on itself before the untrusted code runs (no ``preexec_fn``, which is unsafe
in a multi-threaded trainer). ``-I`` ignores PYTHON* variables and the user site; the code is read from
``main.py`` in the temp dir, which is deleted afterwards.

What this does NOT protect against (use a container / seccomp / nsjail for hostile code): network access,
reading world-readable files, a child that calls ``setsid()`` to leave the process group before the kill,
and — as root, where RLIMIT_NPROC is not enforced — an unbounded fork bomb. It guards the trainer against
buggy or runaway code from a small model, not against a determined attacker.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

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


def _read_capped(path: str, cap: int) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(cap).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the child leads its own session, so its pgid == its pid
    except (ProcessLookupError, PermissionError):
        pass


def _classify(returncode: int, timed_out: bool, stderr: str) -> str:
    if timed_out or returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "timeout"
    if returncode == -signal.SIGXFSZ or "File too large" in stderr[-2000:]:  # Python ignores SIGXFSZ: EFBIG
        return "output_limit"
    if returncode == 0:
        return "ok"
    if "MemoryError" in stderr[-2000:] or (returncode in (-signal.SIGSEGV, -signal.SIGABRT) and "memory" in stderr.lower()):
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
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a sandboxed child Python; never raises for anything the code does.

    wall_timeout_s: the deadline for the whole process group (killed with SIGKILL at expiry).
    cpu_time_s: RLIMIT_CPU (default: ceil(wall_timeout_s)). memory_mb: RLIMIT_AS. max_output_bytes:
    RLIMIT_FSIZE, which caps stdout, stderr and any file the code writes. max_processes: RLIMIT_NPROC
    (per user, ignored for root; None leaves it unset).
    """
    cpu = max(1, int(math.ceil(cpu_time_s if cpu_time_s is not None else wall_timeout_s)))
    prelude = _PRELUDE.format(
        memory=int(memory_mb) << 20,
        cpu=cpu,
        cpu_hard=cpu + 1,
        fsize=int(max_output_bytes),
        nproc=f'_lim("RLIMIT_NPROC", {int(max_processes)})' if max_processes else "",
    )
    start = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="posttrain-sandbox-")
    try:
        with open(os.path.join(tmp, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        with open(os.path.join(tmp, "stdin.txt"), "w", encoding="utf-8") as f:
            f.write(stdin)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        out_path, err_path = os.path.join(tmp, "stdout.txt"), os.path.join(tmp, "stderr.txt")
        with open(os.path.join(tmp, "stdin.txt"), "rb") as fin, open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
            try:
                proc = subprocess.Popen(
                    [python, "-I", "-c", prelude],
                    cwd=tmp, env=env, stdin=fin, stdout=fout, stderr=ferr,
                    start_new_session=True, close_fds=True,
                )
            except OSError as e:
                return SandboxResult("crashed", None, "", f"could not start the sandbox: {e}", time.monotonic() - start)
            timed_out = False
            try:
                proc.wait(timeout=wall_timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc.pid)  # always: also reaps children left behind by a normal exit
                proc.wait()
        stdout = _read_capped(out_path, max_output_bytes)
        stderr = _read_capped(err_path, max_output_bytes)
        status = _classify(proc.returncode, timed_out, stderr)
        return SandboxResult(status, proc.returncode, stdout, stderr, time.monotonic() - start)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
