"""Escapes through identity and the kernel: the child runs as uid/gid 65534 with no capabilities, under seccomp,
with /proc/sys, /sys and / read-only, no root-only file or home-directory key in sight, and the dangerous system
calls refused, whoever runs the trainer (root, or an ordinary user); a sandbox that cannot drop to 65534 never runs
the code. The same probe in the rlimit opt-in sees each escape, so each check can fail (``_escape.py``)."""

import errno
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from posttrain.rewards import isolation, seccomp
from posttrain.rewards.sandbox import run_python

sys.path.insert(0, str(Path(__file__).parent))  # the suite runs with --import-mode=importlib
from _escape import QUIET, needs_bwrap  # noqa: E402

pytestmark = QUIET


# ------------------------------------------------------------------------------------------- privileges
# The child is uid/gid 65534 with no capabilities, whoever runs the trainer: tried here as this process's user
# (root in CI) and, below, from a trainer that is itself an ordinary user.

_PRIVILEGES = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
out = {"uid": os.getresuid(), "gid": os.getresgid(), "groups": os.getgroups()}
with open("/proc/self/status") as f:
    status = dict(line.split(":", 1) for line in f if ":" in line)
out["caps"] = {k: int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
out["no_new_privs"], out["seccomp"] = int(status["NoNewPrivs"]), int(status["Seccomp"])

def attempt(name, fn):
    try:
        fn()
        out[name] = "done"
    except OSError as e:
        out[name] = e.errno

def write_sysctl():
    fd = os.open("/proc/sys/kernel/core_uses_pid", os.O_WRONLY)
    os.write(fd, NEW_VALUE)
attempt("sysctl_write", write_sysctl)
with open("/proc/self/mountinfo") as f:  # mount point -> its per-mount options
    mounts = {line.split()[4]: line.split()[5].split(",") for line in f}
out["read_only"] = {p: "ro" in mounts.get(p, []) for p in ("/proc/sys", "/sys", "/")}
for path in ("/sys/kernel/uevent_helper", "/sys/fs/cgroup/memory/release_agent", "/proc/sysrq-trigger"):
    if os.path.exists(path):  # opened, never written: nothing changes even where it would succeed
        attempt("open_for_write " + path, lambda: os.close(os.open(path, os.O_WRONLY)))
for path in ("/etc/shadow", "/etc/gshadow"):
    attempt("read " + path, lambda: open(path, "rb").read())
attempt("list /root", lambda: out.__setitem__("/root entries", sorted(os.listdir("/root"))))
for name in SECRETS:
    attempt("read " + name, lambda: out.__setitem__("secret " + name, open(name).read()))

def call(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(NR[name], *args)
    out[name] = 0 if r == 0 else ctypes.get_errno()
# arguments that make each call fail harmlessly (ESRCH, ENOENT, EINVAL, EFAULT, EBADF, ...) when it is allowed
call("ptrace", 2, 2**22 - 7, 0, 0)                       # PEEKDATA on a pid that does not exist
call("mount", None, b"/nonexistent-posttrain", None, 0, None)
call("umount2", b"/nonexistent-posttrain", 0)
call("keyctl", 0, -1000, 0)                               # GET_KEYRING_ID of no keyring
call("add_key", b"no-such-type", b"d", None, 0, -2)
call("bpf", 9999, None, 0)
call("perf_event_open", None, 0, -1, -1, 0)
call("unshare", 1)                                         # not a namespace flag
call("setns", -1, 0)
call("userfaultfd", -1)
call("process_vm_readv", 2**22 - 7, None, 0, None, 0, 0)
call("open_by_handle_at", -1, None, 0)
call("chroot", b"/nonexistent-posttrain")
print(json.dumps(out))
"""

_SYSCALLS_TRIED = (
    "ptrace", "mount", "umount2", "keyctl", "add_key", "bpf", "perf_event_open", "unshare", "setns", "userfaultfd",
    "process_vm_readv", "open_by_handle_at", "chroot",
)  # fmt: skip


def _privilege_probe(host_value: bytes, secrets_: list[str], change: bool = True) -> str:
    """The probe; it writes the other value of kernel.core_uses_pid (or, change=False, the host's own value)."""
    arch = seccomp.machine()
    nrs = {n: seccomp.SYSCALLS[arch][n] for n in _SYSCALLS_TRIED}
    value = (b"0" if host_value.strip() == b"1" else b"1") if change else host_value.strip()
    head = f"NEW_VALUE = {value!r}\nSECRETS = {secrets_!r}\nNR = {nrs!r}\n"
    return head + _PRIVILEGES


@pytest.fixture
def core_uses_pid():
    """kernel.core_uses_pid (harmless: whether core file names get a .PID): its value, restored if it changes."""
    path = "/proc/sys/kernel/core_uses_pid"
    with open(path, "rb") as f:
        before = f.read()
    yield before
    with open(path, "rb") as f:
        after = f.read()
    if after != before and os.geteuid() == 0:
        with open(path, "wb") as f:
            f.write(before)
    assert after == before, "the sandboxed code changed a kernel setting of the host"


@pytest.fixture
def secret_home(tmp_path_factory, monkeypatch):
    """A home directory (HOME) holding a world-readable ~/.ssh key, where the sandbox can see the tree."""
    home = tempfile.mkdtemp(prefix="home-", dir=sys.prefix)
    os.chmod(home, 0o755)
    os.mkdir(os.path.join(home, ".ssh"), 0o755)
    key = os.path.join(home, ".ssh", "id_ed25519")
    with open(key, "w") as f:
        f.write("PRIVATE KEY " + secrets.token_hex(8))
    os.chmod(key, 0o644)
    monkeypatch.setenv("HOME", home)
    yield key
    os.remove(key)
    os.rmdir(os.path.join(home, ".ssh"))
    os.rmdir(home)


def _check_contained(out: dict, key: str) -> None:
    assert out["uid"] == [65534] * 3 and out["gid"] == [65534] * 3 and set(out["groups"]) <= {65534}
    assert out["caps"] == dict.fromkeys(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"), 0)
    assert out["no_new_privs"] == 1 and out["seccomp"] == 2
    assert out["sysctl_write"] in (errno.EACCES, errno.EROFS, errno.EPERM)
    assert out["read_only"] == {"/proc/sys": True, "/sys": True, "/": True}  # also for root inside, if it were
    for name, value in out.items():
        if name.startswith("open_for_write "):
            assert value in (errno.EACCES, errno.EROFS, errno.EPERM), name
    assert out["read /etc/shadow"] in (errno.EACCES, errno.ENOENT) and out["read /etc/gshadow"] in (
        errno.EACCES,
        errno.ENOENT,
    )
    # /root is an empty tmpfs, except the directories leading to an interpreter that lives there
    prefixes = {p.split("/")[2] for p in isolation._prefixes(sys.executable) if p.startswith("/root/")}
    assert set(out["/root entries"]) <= prefixes
    assert out["read " + key] == errno.ENOENT and "secret " + key not in out
    for name in _SYSCALLS_TRIED:
        assert out[name] == errno.EPERM, (name, out[name])


def _run_probe(mode: str, key: str, host_value: bytes, change: bool = True) -> dict:
    r = run_python(_privilege_probe(host_value, [key], change), isolation=mode, wall_timeout_s=10.0)
    assert r.status == "ok", (r.status, r.stderr[-800:])
    return json.loads(r.stdout)


@needs_bwrap
def test_the_child_is_nobody_without_capabilities_and_cannot_reach_root_files_or_the_kernel(core_uses_pid, secret_home):
    _check_contained(_run_probe("bwrap", secret_home, core_uses_pid), secret_home)


def test_the_privilege_probe_sees_the_escapes_without_bwrap(core_uses_pid, secret_home):
    """The same probe in the rlimit mode: it reads the key, and no call is refused, so each check can fail.

    (It writes the host's own value of the sysctl back: as root that write succeeds, and changes nothing.)"""
    out = _run_probe("rlimit", secret_home, core_uses_pid, change=False)
    assert out["secret " + secret_home].startswith("PRIVATE KEY ") and out["seccomp"] == 0
    assert all(out[name] not in (0, errno.EPERM) for name in _SYSCALLS_TRIED), out
    if os.geteuid() == 0:
        assert out["read /etc/shadow"] == "done" and out["uid"] == [0, 0, 0] and out["sysctl_write"] == "done"


@needs_bwrap
def test_the_probe_from_the_report_is_contained(core_uses_pid):
    path = "/proc/sys/kernel/core_uses_pid"
    changed = os.geteuid() == 0 and core_uses_pid.strip() == b"1"
    if changed:  # start from 0 so that the probe's write of 1 would show
        with open(path, "wb") as f:
            f.write(b"0")
    try:
        with open(path, "rb") as f:
            start = f.read()
        r = run_python(
            "import os; os.write(os.open('/proc/sys/kernel/core_uses_pid', os.O_WRONLY), b'1'); "
            "print(len(open('/etc/shadow').read()))"
        )
        with open(path, "rb") as f:
            assert f.read() == start
        assert r.stdout == "" and r.status == "error" and "PermissionError" in r.stderr
    finally:
        if changed:
            with open(path, "wb") as f:
                f.write(core_uses_pid)


_ORDINARY_USER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from posttrain.rewards.sandbox import run_python
r = run_python(open(sys.argv[2]).read(), isolation="bwrap", wall_timeout_s=10.0)
print(json.dumps({"status": r.status, "stdout": r.stdout, "stderr": r.stderr[-800:]}))
"""


def _as_ordinary_user(argv: list[str], home: str) -> subprocess.CompletedProcess:
    cmd = (
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--"] if shutil.which("setpriv") else None
    )
    if cmd is None and shutil.which("runuser"):
        cmd = ["runuser", "-u", "nobody", "--"]
    if cmd is None:
        pytest.skip("neither setpriv nor runuser is installed: cannot start an unprivileged trainer")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "LANG": "C.UTF-8"}
    return subprocess.run(cmd + argv, capture_output=True, text=True, env=env, timeout=120, cwd="/")


@needs_bwrap
def test_an_unprivileged_trainer_gets_the_same_containment(core_uses_pid, secret_home, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("this process is already an ordinary user: the tests above are that case")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    shared = tempfile.mkdtemp(prefix="ordinary-")  # readable by the ordinary user; the probe and its home
    os.chmod(shared, 0o755)
    try:
        for name, text in (
            ("trainer.py", _ORDINARY_USER),
            ("probe.py", _privilege_probe(core_uses_pid, [secret_home])),
        ):
            with open(os.path.join(shared, name), "w") as f:
                f.write(text)
            os.chmod(os.path.join(shared, name), 0o644)
        pythons = dict.fromkeys((sys.executable, "/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3")))
        tried = []
        for python in filter(None, pythons):  # an interpreter the ordinary user can run posttrain with
            r = _as_ordinary_user(
                [python, "-I", os.path.join(shared, "trainer.py"), repo, os.path.join(shared, "probe.py")],
                secret_home.rsplit("/.ssh", 1)[0],
            )
            if r.returncode == 0:
                break
            tried.append(f"{python}: {(r.stderr.strip().splitlines() or ['exit %d' % r.returncode])[-1]}")
        else:
            pytest.skip("no interpreter an ordinary user can run posttrain with: " + "; ".join(tried))
        res = json.loads(r.stdout)
        assert res["status"] == "ok", res
        _check_contained(json.loads(res["stdout"]), secret_home)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@needs_bwrap
def test_a_sandbox_that_cannot_drop_to_65534_never_runs_the_code(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("the id maps are written by the trainer only when it is root")

    def refuse(pid):
        raise isolation.SandboxStartError("cannot map uid/gid 65534 into the sandbox (Operation not permitted)")

    monkeypatch.setattr(isolation, "_write_id_maps", refuse)
    r = run_python("print('ran')", isolation="bwrap")
    assert r.status == "crashed" and r.stdout == "" and "cannot map uid/gid 65534" in r.stderr
