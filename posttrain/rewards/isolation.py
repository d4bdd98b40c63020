"""How the sandbox isolates a child: bubblewrap namespaces ("bwrap"), or, by explicit opt-in, rlimits only ("rlimit").

Key insight: rlimits bound what a process may *consume*, not what it may *reach*; only namespaces take the
trainer, its files, its environment and the network out of the child's sight. And a user namespace alone
does not make root harmless: a child that is the trainer's uid 0 "mapped" into its namespace still owns
every root-owned file on the host (it read ``/etc/shadow`` and wrote ``/proc/sys/kernel/*``). So the code
runs as an unprivileged uid and gid (65534, "nobody") with no capabilities at all, under ``bwrap`` (Debian
package ``bubblewrap``) when it works here; otherwise the ``code`` reward refuses to run unless the user opts
in to the weaker mode.

    bwrap --unshare-all --unshare-user --die-with-parent --new-session --cap-drop ALL
          --ro-bind / / --dev /dev --proc /proc            read-only root; fresh /dev; /proc of the new PID ns
          --ro-bind /proc/sys /proc/sys                     sysctls read-only (/sys is read-only with the root)
          --ro-bind /dev/null /etc/shadow ...               shadow and gshadow files hidden (unreadable)
          --size --tmpfs /tmp /var/tmp /run /root /home ~   hide the trainer's temp files and home directories
          --size --tmpfs /dev/shm --remount-ro /dev         (every writable tmpfs has a size cap)
          --ro-bind <python prefix>                         ... except the interpreter, when it lives there
          --dir /tmp/sandbox --ro-bind main.py --chdir     a private, size-capped tmpfs work dir
          --seccomp FD                                      posttrain.rewards.seccomp (ptrace, mount, bpf, ...)
          --clearenv --setenv PATH/HOME/TMPDIR/LANG/LC_ALL  none of the trainer's environment
          python -I -c DROP + PRELUDE

Who the child is. Trainer not root: bwrap maps the sandbox uid/gid 65534 to the trainer's own uid
(``--uid 65534 --gid 65534 --disable-userns``), so the code can read what the trainer's user can read outside
the hidden directories, nothing more. Trainer root: a mapped uid would be host root, so bwrap is started with
``--uid 0 --userns-block-fd --info-fd``, and the trainer writes the namespace's maps itself
(``0 0 1`` for the setup, ``65534 65534 1``), joins the run's cgroups and only then lets it go on: bwrap sets
the mounts up as root (it can reach an interpreter under ``/root``), keeps only CAP_SETUID, CAP_SETGID and
CAP_SETPCAP, and the child's first act (DROP, before any untrusted byte is read) empties the bounding set,
drops the supplementary groups and becomes host uid/gid 65534 with every capability set empty; it exits
instead of running the code if any of that did not hold. Either way the code runs with ``no_new_privs``.

The knob is ``isolation``: "bwrap" (bwrap or a UserError), "rlimit" (the weaker mode, with a warning) or
"auto" (bwrap, else a UserError naming the opt-in). Where it is not passed (None), the environment variable
``POSTTRAIN_SANDBOX`` supplies it (the CLI path), default "auto". bwrap is checked once per process by a
self-test run (a missing binary, or a kernel or container that forbids user namespaces, fails it).

Processes and memory: per-run cgroups (posttrain.rewards.cgroups) where ``/sys/fs/cgroup`` lets us.

Not handled: reads of world-readable files outside the hidden directories (the root is read-only, not
hidden); when the trainer is not root, files its own user or groups can read; kernel bugs reachable through
the system calls the filter allows; CPU time of the machine before the deadline.
"""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import subprocess
import sys
import time
import warnings

from posttrain.errors import ConfigError, UserError
from posttrain.rewards import cgroups, seccomp

ISOLATION_MODES = ("auto", "bwrap", "rlimit")
ENV_VAR = "POSTTRAIN_SANDBOX"
WORKDIR = "/tmp/sandbox"  # the child's cwd and HOME inside bwrap
SANDBOX_UID = SANDBOX_GID = 65534  # "nobody": owns no file on a usual host
_SMALL_TMPFS = 1 << 20  # bytes, for the hidden dirs other than /tmp and for /dev/shm
_HIDDEN = ("/tmp", "/var/tmp", "/run", "/root", "/home")
_SECRET_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/security/opasswd")
_KEPT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")  # root mode only, for DROP; gone before the code runs

# The child's first statements under bwrap. Root mode: empty the bounding set (PR_CAPBSET_DROP = 24), drop the
# groups, become 65534, clear the inheritable set (capset v3 = 0x20080522 with zeros). Both modes: exit before
# the code runs unless the uids, gids and every capability set are as promised.
DROP = f"""\
import os as _os
if _os.getuid() == 0:
    import ctypes as _ct
    _libc = _ct.CDLL(None, use_errno=True)
    for _cap in range(64):
        _libc.prctl(24, _cap, 0, 0, 0)
    _os.setgroups([])
    _os.setgid({SANDBOX_GID})
    _os.setuid({SANDBOX_UID})
    _libc.capset((_ct.c_uint32 * 2)(0x20080522, 0), (_ct.c_uint32 * 6)())
    del _ct, _libc, _cap
with open("/proc/self/status") as _f:
    _caps = [_l.split()[1] for _l in _f if _l.startswith("Cap")]
if (
    _os.getresuid() != ({SANDBOX_UID},) * 3
    or _os.getresgid() != ({SANDBOX_GID},) * 3
    or not set(_os.getgroups()) <= {{{SANDBOX_GID}}}
    or len(_caps) < 5
    or any(int(_c, 16) for _c in _caps)
):
    _os.write(2, b"bwrap: the sandbox could not drop its privileges\\n")
    _os._exit(1)
del _os, _f, _caps
"""
_SELF_TEST = DROP + "import os; print('posttrain-sandbox-ok', os.getpid() <= 3, os.getuid())"  # fresh PID ns


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
    bwrap: str,
    python_argv: list[str],
    *,
    main_py: str | None = None,
    tmpfs_bytes: int = 64 << 20,
    seccomp_fd: int | None = None,
    handshake: tuple[int, int] | None = None,
) -> list[str]:
    """The bwrap command line that runs ``python_argv`` (see the module docstring for the layout).

    handshake: ``(userns_block_fd, info_fd)`` when the trainer is root (it writes the id maps, see start_bwrap);
    None: bwrap maps the sandbox uid 65534 to the trainer's own uid.
    """
    argv = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if handshake is None:
        argv += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--disable-userns"]
    else:  # no --disable-userns (bwrap refuses it with a block fd): the seccomp filter refuses new namespaces
        argv += ["--uid", "0", "--gid", "0", "--userns-block-fd", str(handshake[0]), "--info-fd", str(handshake[1])]
        for cap in _KEPT_CAPS:
            argv += ["--cap-add", cap]
    argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    for f in _SECRET_FILES:
        if os.path.isfile(f):
            argv += ["--ro-bind", "/dev/null", f]  # mounted nodev: opening it fails with EACCES
    home = os.path.realpath(os.path.expanduser("~"))
    hidden = [d for d in dict.fromkeys((*_HIDDEN, home)) if d not in ("/", "") and os.path.isdir(d)]
    for d in hidden:  # every writable mount is size-capped: files in RAM cannot outgrow the budget
        perms = "1777" if d in ("/tmp", "/var/tmp") else "0755"  # made by root in root mode: 65534 writes here only
        argv += ["--size", str(int(tmpfs_bytes) if d == "/tmp" else _SMALL_TMPFS), "--perms", perms, "--tmpfs", d]
    argv += ["--size", str(_SMALL_TMPFS), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    for p in _prefixes(python_argv[0]):
        under = [d for d in hidden if p == d or p.startswith(d.rstrip("/") + "/")]
        if under and os.path.isdir(p):
            # the directories between the tmpfs and the prefix, made 0755 (bwrap would make them 0700)
            parts = os.path.relpath(p, max(under, key=len)).split(os.sep)
            for k in range(1, len(parts)):
                argv += ["--dir", os.path.join(max(under, key=len), *parts[:k])]
            argv += ["--ro-bind", p, p]
            # a hidden directory inside that prefix (a home under /tmp/...) is hidden again over the bind
            for d in hidden:
                if d.startswith(p.rstrip("/") + "/"):
                    argv += ["--size", str(_SMALL_TMPFS), "--perms", "0755", "--tmpfs", d]
    argv += ["--perms", "0777", "--dir", WORKDIR]
    if main_py is not None:
        argv += ["--ro-bind", main_py, WORKDIR + "/main.py"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--chdir", WORKDIR, "--clearenv"]
    for k, v in sandbox_env(WORKDIR).items():
        argv += ["--setenv", k, v]
    return argv + ["--", *python_argv]


class SandboxStartError(OSError):
    """bwrap could not be started, or its namespace could not be set up as required (the child was killed)."""


def _read_child_pid(fd: int, deadline: float) -> int | None:
    """The sandbox child's pid from bwrap's ``--info-fd`` JSON, or None when bwrap closed it without one."""
    buf = b""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(max(1, int(left * 1000))):
            raise SandboxStartError("bwrap did not report its child in time")
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    try:
        return int(json.loads(buf)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def _write_id_maps(pid: int) -> None:
    """uid/gid maps of the child's new user namespace: root for bwrap's setup, and the sandbox's ids."""
    line = f"0 0 1\n{SANDBOX_UID} {SANDBOX_UID} 1\n"
    for name, text in (("uid_map", line), ("gid_map", line.replace(str(SANDBOX_UID), str(SANDBOX_GID)))):
        try:
            fd = os.open(f"/proc/{pid}/{name}", os.O_WRONLY)
            try:
                os.write(fd, text.encode())  # one write: the kernel takes a map in a single write only
            finally:
                os.close(fd)
        except OSError as e:  # e.g. a container whose root has no uid 65534 to give
            raise SandboxStartError(f"cannot map uid/gid {SANDBOX_UID} into the sandbox ({e.strerror})") from None


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def start_bwrap(
    python_argv: list[str],
    *,
    main_py: str | None = None,
    tmpfs_bytes: int = 64 << 20,
    cgroup_paths: list[str] = (),
    setup_timeout_s: float = 20.0,
    **popen_kw,
) -> subprocess.Popen:
    """Start ``python_argv`` under bwrap as uid/gid 65534 in the given cgroups, in its own session; returns the Popen.

    Raises OSError (SandboxStartError) when it cannot be started as promised; the child is then killed, never
    left to run with more privileges. ``popen_kw`` go to Popen (stdin, stdout, stderr, env, cwd).
    """
    bwrap = find_bwrap() or "bwrap"
    sec = seccomp.filter_fd()
    child_fds = [] if sec is None else [sec]
    as_root = os.geteuid() == 0
    info_r = block_w = None
    try:
        if as_root:
            info_r, info_w = os.pipe()
            block_r, block_w = os.pipe()
            child_fds += [block_r, info_w]
            argv = bwrap_argv(
                bwrap,
                python_argv,
                main_py=main_py,
                tmpfs_bytes=tmpfs_bytes,
                seccomp_fd=sec,
                handshake=(block_r, info_w),
            )
        else:
            argv = bwrap_argv(bwrap, python_argv, main_py=main_py, tmpfs_bytes=tmpfs_bytes, seccomp_fd=sec)
            if cgroup_paths:
                argv = cgroups.join_cgroup_argv(list(cgroup_paths), argv)
        try:
            proc = subprocess.Popen(argv, pass_fds=child_fds, start_new_session=True, close_fds=True, **popen_kw)
        finally:
            for fd in child_fds:
                os.close(fd)
            child_fds = []
        if as_root:
            try:
                pid = _read_child_pid(info_r, time.monotonic() + setup_timeout_s)
                if pid is None:  # bwrap failed (its message is on its stderr): it must not go on
                    _kill(proc)
                    return proc
                _write_id_maps(pid)
                for path in cgroup_paths:
                    cgroups.join(path, pid)  # the child has not forked yet: it waits for the byte below
                os.write(block_w, b"1")
            except BaseException:
                _kill(proc)
                raise
        return proc
    finally:
        for fd in (*child_fds, info_r, block_w):
            if fd is not None:
                os.close(fd)


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
        proc = start_bwrap(
            [sys.executable, "-I", "-c", _SELF_TEST],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd="/",
        )
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap failed its self-test ({e})"
    expected = f"posttrain-sandbox-ok True {SANDBOX_UID}".encode()
    if proc.returncode != 0 or out.strip() != expected:
        err = err.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap failed its self-test (exit {proc.returncode}: {err[-1] if err else 'no output'})"
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
