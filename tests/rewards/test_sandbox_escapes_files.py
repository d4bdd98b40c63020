"""Escapes to what the trainer can reach: files outside the sandbox, the secrets in the trainer's and other
processes' environments, and the network. Each attack runs in bwrap (must fail) and in the rlimit opt-in (where it
succeeds, proving the attack real); ``_escape.py`` says more."""

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the suite runs with --import-mode=importlib
from _escape import MODES, QUIET, run_in  # noqa: E402

pytestmark = QUIET


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
        out = run_in(code, mode).stdout.splitlines()
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
    out = run_in(code, mode).stdout.strip()
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
        out = run_in(code, mode).stdout.splitlines()
        if mode == "bwrap":
            assert out == ["local ConnectionRefusedError", "outward OSError", "dns gaierror"]
            with pytest.raises(TimeoutError):
                server.accept()  # nobody ever reached the trainer's port
        else:  # documented: the rlimit mode cannot stop it
            assert out[0] == "local connected"
            server.accept()[0].close()
