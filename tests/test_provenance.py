"""posttrain.provenance: the running tree's commit from a checkout, from a `git archive` copy, or "unknown"."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from posttrain.provenance import PACKAGE_DIR, archived_commit, git_commit, git_dirty

ROOT = PACKAGE_DIR.parent
GIT = shutil.which("git")


def _git(cwd: Path, *args: str) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args]
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _head() -> str | None:
    if GIT is None:
        return None
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    tracked = subprocess.run(
        ["git", "-C", str(PACKAGE_DIR), "ls-files", "--error-unmatch", "__init__.py"], capture_output=True
    )
    return r.stdout.strip() if r.returncode == 0 and tracked.returncode == 0 else None


HEAD = _head()  # None: not a git checkout of posttrain (a tarball, or no git)


def test_archived_commit_reads_a_hash_and_refuses_the_placeholder(tmp_path):
    f = tmp_path / "COMMIT"
    f.write_text("$Format:%H$\n")
    assert archived_commit(f) is None  # a plain copy of the files: git archive did not fill it in
    f.write_text("0123456789abcdef0123456789abcdef01234567\n")
    assert archived_commit(f) == "0123456789abcdef0123456789abcdef01234567"
    f.write_text("not-a-hash\n")
    assert archived_commit(f) is None
    assert archived_commit(tmp_path / "missing") is None


@pytest.mark.skipif(HEAD is None, reason="not a git checkout of posttrain")
def test_a_checkout_reports_its_head():
    assert git_commit(short=False) == HEAD
    assert git_commit() == HEAD[:7]
    assert git_dirty() in (True, False)


@pytest.mark.skipif(HEAD is None, reason="not a git checkout of posttrain")
def test_a_git_archive_copy_carries_its_commit(tmp_path):
    """What a release tarball or a sweep's snapshot is: no .git, the commit written by export-subst."""
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD", "posttrain"], check=True, capture_output=True)
    with tarfile.open(fileobj=io.BytesIO(blob.stdout)) as tar:
        try:
            tar.extractall(tmp_path, filter="data")
        except TypeError:  # Python before the extraction filters (3.10.11 and older)
            tar.extractall(tmp_path)
    pkg = tmp_path / "posttrain"
    assert git_commit(short=False, package_dir=pkg) == HEAD
    assert git_dirty(pkg) is None


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_a_copy_inside_another_repository_is_unknown(tmp_path):
    """A virtual environment inside a user's own repository: that repository's HEAD is not posttrain's commit."""
    _git(tmp_path, "init", "-q")
    (tmp_path / "theirs.txt").write_text("x")
    _git(tmp_path, "add", "theirs.txt")
    _git(tmp_path, "commit", "-q", "-m", "their project")
    pkg = tmp_path / ".venv" / "site-packages" / "posttrain"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "COMMIT").write_text("$Format:%H$\n")
    assert git_commit(package_dir=pkg) == "unknown"
    assert git_dirty(pkg) is None
