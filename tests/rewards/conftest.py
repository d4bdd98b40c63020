"""Fixtures of the sandbox escape tests (``test_sandbox_escapes_*.py``; their helpers are in ``_escape.py``)."""

import secrets
import subprocess

import pytest

from posttrain.rewards import isolation


@pytest.fixture
def victim():
    """A sleeping process with a secret in its environment (visible in its /proc/<pid>/environ)."""
    secret = "s3cret-" + secrets.token_hex(8)
    proc = subprocess.Popen(["sleep", "60"], env={"PATH": "/usr/bin:/bin", "POSTTRAIN_VICTIM_SECRET": secret})
    yield proc, secret
    proc.kill()
    proc.wait()


@pytest.fixture
def no_bwrap(monkeypatch):
    """As on a machine without bubblewrap (and without the POSTTRAIN_SANDBOX opt-in)."""
    monkeypatch.setattr(isolation, "find_bwrap", lambda: None)
    monkeypatch.delenv(isolation.ENV_VAR, raising=False)
    isolation.bwrap_problem.cache_clear()
    yield
    monkeypatch.undo()
    isolation.bwrap_problem.cache_clear()
