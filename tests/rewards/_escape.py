"""What the sandbox escape tests share (``test_sandbox_escapes_*.py``): the modes each attack is tried in, running
code in one, and telling a live process from a dead one. Their fixtures are in ``conftest.py`` beside this file.

Every attack targets a *victim* the test owns (a sleeping process, a file, a listening socket), never the test
process itself, so a successful escape shows up as a failed assertion, not a dead pytest. Running the same
attack in rlimit mode, where the sandbox's docstring says it succeeds, proves each attack is real: a test that
only ever sees "contained" could not tell a working sandbox from a broken attack. bwrap tests are skipped (saying
why) where bubblewrap does not work; the refusal path is tested everywhere.
"""

import pytest

from posttrain.rewards import isolation
from posttrain.rewards.sandbox import run_python

HAVE_BWRAP = isolation.bwrap_problem() is None
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason=f"bubblewrap unavailable: {isolation.bwrap_problem()}")
MODES = [pytest.param("bwrap", marks=needs_bwrap), "rlimit"]
QUIET = pytest.mark.filterwarnings("ignore::posttrain.rewards.isolation.WeakSandboxWarning")  # the rlimit opt-in's


def run_in(code: str, mode: str, **kw):
    """``code`` run in the sandbox ``mode`` (5 s unless ``wall_timeout_s``); it must have run (ok or timed out)."""
    r = run_python(code, isolation=mode, wall_timeout_s=kw.pop("wall_timeout_s", 5.0), **kw)
    assert r.status in ("ok", "timeout"), (r.status, r.stderr[-500:])
    return r


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
