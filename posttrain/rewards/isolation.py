"""How the sandbox isolates a child: bubblewrap namespaces ("bwrap"), or, by explicit opt-in, rlimits only ("rlimit").

Key insight: rlimits bound what a process may *consume*, not what it may *reach*; only namespaces take the
trainer, its files, its environment and the network out of the child's sight. So untrusted code runs under
``bwrap`` (Debian package ``bubblewrap``) when it works here, and otherwise the ``code`` reward refuses to
run unless the user opts in to the weaker mode.

    bwrap --unshare-all --unshare-user --disable-userns --die-with-parent --new-session --cap-drop ALL
          --ro-bind / / --dev /dev --proc /proc            read-only root; fresh /dev; /proc of the new PID ns
          --size --tmpfs /tmp /var/tmp /run /root /home ~   hide the trainer's temp files and home directories
          --size --tmpfs /dev/shm --remount-ro /dev         (every writable tmpfs has a size cap)
          --ro-bind <python prefix>                         ... except the interpreter, when it lives there
          --dir /tmp/sandbox --ro-bind main.py --chdir     a private, size-capped tmpfs work dir
          --clearenv --setenv PATH/HOME/TMPDIR/LANG/LC_ALL  none of the trainer's environment
          python -I -c PRELUDE

The knob is ``isolation``: "bwrap" (bwrap or a UserError), "rlimit" (the weaker mode, with a warning) or
"auto" (bwrap, else a UserError naming the opt-in). Where it is not passed (None), the environment variable
``POSTTRAIN_SANDBOX`` supplies it (the CLI path), default "auto". bwrap is checked once per process by a
self-test run (a missing binary, or a kernel or container that forbids user namespaces, fails it).

Process count: a pids cgroup (``pids.max``) is created per run where ``/sys/fs/cgroup`` lets us (v1 ``pids``
hierarchy, or a v2 root with ``pids`` delegated); the child joins it before it execs, so every descendant is
counted. Without one, RLIMIT_NPROC is the bound, which the kernel does not enforce for uid 0: as root, a
fork bomb is then bounded only by the wall-clock kill.

Not handled: reads of world-readable files outside the hidden directories (the root is read-only, not
hidden); CPU and memory use of the machine by many processes before the deadline (no memory cgroup);
kernel exploits (no seccomp filter).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
import uuid
import warnings

from posttrain.errors import ConfigError, UserError

ISOLATION_MODES = ("auto", "bwrap", "rlimit")
ENV_VAR = "POSTTRAIN_SANDBOX"
WORKDIR = "/tmp/sandbox"  # the child's cwd and HOME inside bwrap
_SMALL_TMPFS = 1 << 20  # bytes, for the hidden dirs other than /tmp and for /dev/shm
_HIDDEN = ("/tmp", "/var/tmp", "/run", "/root", "/home")
_SELF_TEST = "import os; print('posttrain-sandbox-ok', os.getpid() <= 3)"  # a fresh PID namespace


class WeakSandboxWarning(UserWarning):
    """The rlimit-only sandbox is in use: the code it runs can reach the trainer, its files and the network."""


def find_bwrap() -> str | None:
    """The bwrap binary, or None (tests monkeypatch this to simulate a machine without it)."""
    return shutil.which("bwrap")


def _prefixes(python: str) -> list[str]:
    """Directories the interpreter needs: its install prefixes (of this process when ``python`` is ours)."""
    real = os.path.realpath(python)
    dirs = {os.path.dirname(os.path.dirname(real)), os.path.dirname(os.path.dirname(os.path.abspath(python)))}
    if real == os.path.realpath(sys.executable):
        dirs |= {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    return sorted(dirs)


def bwrap_argv(
    bwrap: str, python_argv: list[str], *, main_py: str | None = None, tmpfs_bytes: int = 64 << 20
) -> list[str]:
    """The bwrap command line that runs ``python_argv`` (see the module docstring for the layout)."""
    argv = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
    ]
    home = os.path.realpath(os.path.expanduser("~"))
    hidden = [d for d in dict.fromkeys((*_HIDDEN, home)) if d not in ("/", "") and os.path.isdir(d)]
    for d in hidden:  # every writable mount is size-capped: files in RAM cannot outgrow the budget
        argv += ["--size", str(int(tmpfs_bytes) if d == "/tmp" else _SMALL_TMPFS), "--tmpfs", d]
    argv += ["--size", str(_SMALL_TMPFS), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    for p in _prefixes(python_argv[0]):
        if any(p == d or p.startswith(d.rstrip("/") + "/") for d in hidden) and os.path.isdir(p):
            argv += ["--ro-bind", p, p]
    argv += ["--dir", WORKDIR]
    if main_py is not None:
        argv += ["--ro-bind", main_py, WORKDIR + "/main.py"]
    argv += ["--chdir", WORKDIR, "--clearenv"]
    for k, v in sandbox_env(WORKDIR).items():
        argv += ["--setenv", k, v]
    return argv + ["--", *python_argv]


def sandbox_env(home: str) -> dict[str, str]:
    """The whole environment of a sandboxed child: nothing from the trainer's."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }


@functools.lru_cache(maxsize=None)
def bwrap_problem() -> str | None:
    """None when bwrap works here (a self-test run of this interpreter, once per process), else why it does not."""
    bwrap = find_bwrap()
    if bwrap is None:
        return "bwrap is not installed (no 'bwrap' on PATH)"
    try:
        r = subprocess.run(
            bwrap_argv(bwrap, [sys.executable, "-I", "-c", _SELF_TEST]),
            capture_output=True,
            timeout=20,
            stdin=subprocess.DEVNULL,
            cwd="/",
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap failed its self-test ({e})"
    if r.returncode != 0 or r.stdout.strip() != b"posttrain-sandbox-ok True":
        err = r.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap failed its self-test (exit {r.returncode}: {err[-1] if err else 'no output'})"
    return None


def resolve_isolation(isolation: str | None = None) -> str:
    """ "bwrap" or "rlimit" for the requested mode; raises UserError when bwrap is needed and does not work."""
    source = "isolation" if isolation is not None else ENV_VAR
    mode = isolation if isolation is not None else os.environ.get(ENV_VAR, "auto")
    if mode not in ISOLATION_MODES:
        raise ConfigError(f"sandbox {source}={mode!r} is not valid; choose one of: {', '.join(ISOLATION_MODES)}")
    if mode == "rlimit":
        warnings.warn(
            "the sandbox runs untrusted code with rlimits only (isolation='rlimit'): that code can signal "
            "your processes, read and write your files, read other processes' environments and use the "
            "network",
            WeakSandboxWarning,
            stacklevel=3,
        )
        return "rlimit"
    problem = bwrap_problem()
    if problem is None:
        return "bwrap"
    raise UserError(
        f"cannot sandbox untrusted code: {problem}; install bubblewrap (Debian/Ubuntu: apt-get install "
        f"bubblewrap) or opt in to the weaker rlimit-only sandbox, which does not keep the code away from "
        f"your processes, files and network, with isolation='rlimit' (CLI: {ENV_VAR}=rlimit)"
    )


# ------------------------------------------------------------------------------------------- pids cgroup


@functools.lru_cache(maxsize=None)
def pids_cgroup_root() -> str | None:
    """A cgroup directory under which we may create per-run pids cgroups, or None (checked once per process)."""
    for root, v2 in (("/sys/fs/cgroup/pids", False), ("/sys/fs/cgroup", True)):
        try:
            if v2 and "pids" not in open(os.path.join(root, "cgroup.subtree_control")).read().split():
                continue
            probe = make_pids_cgroup(root, 8)
            remove_cgroup(probe)
        except OSError:
            continue
        _sweep(root)
        return root
    return None


def _sweep(root: str, min_age_s: float = 600.0) -> None:
    """Remove per-run cgroups that earlier runs left (their last task outlived remove_cgroup's retries): only
    old ones, so a run of another process that has just made its cgroup is left alone."""
    for name in os.listdir(root):
        path = os.path.join(root, name)
        try:
            if name.startswith("posttrain-sandbox-") and time.time() - os.stat(path).st_mtime > min_age_s:
                os.rmdir(path)  # fails (EBUSY) while it still has tasks
        except OSError:
            pass


def make_pids_cgroup(root: str, max_pids: int) -> str:
    path = os.path.join(root, f"posttrain-sandbox-{uuid.uuid4().hex[:12]}")
    os.mkdir(path)
    try:
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(int(max_pids)))
    except OSError:
        os.rmdir(path)
        raise
    return path


def remove_cgroup(path: str, tries: int = 50) -> None:
    """rmdir the cgroup once its (dying) tasks are gone; gives up quietly (a later process sweeps leftovers)."""
    for _ in range(tries):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


def join_cgroup_argv(cgroup: str, argv: list[str]) -> list[str]:
    """Run ``argv`` inside ``cgroup``: a shell joins it, then execs argv, so every descendant is in it."""
    return ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, *argv]
