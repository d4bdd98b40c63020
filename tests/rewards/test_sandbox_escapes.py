"""Escapes from the sandbox, each tried against bwrap mode (must fail) and against the rlimit opt-in.

Every attack targets a *victim* the test owns (a sleeping process, a file, a listening socket), never the test
process itself, so a successful escape shows up as a failed assertion, not a dead pytest. Running the same
attack in rlimit mode, where the module docstring says it succeeds, proves each attack is real: a test that
only ever sees "contained" could not tell a working sandbox from a broken attack.

bwrap tests are skipped (saying why) where bubblewrap does not work; the refusal path is tested everywhere.
"""

import errno
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings

import pytest

from posttrain.errors import ConfigError, UserError
from posttrain.rewards import cgroups, isolation, seccomp
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


@needs_bwrap
def test_a_sandbox_that_cannot_drop_to_65534_never_runs_the_code(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("the id maps are written by the trainer only when it is root")

    def refuse(pid):
        raise isolation.SandboxStartError("cannot map uid/gid 65534 into the sandbox (Operation not permitted)")

    monkeypatch.setattr(isolation, "_write_id_maps", refuse)
    r = run_python("print('ran')", isolation="bwrap")
    assert r.status == "crashed" and r.stdout == "" and "cannot map uid/gid 65534" in r.stderr
