"""Which commit of posttrain is running: for report headers and benchmark JSON.

``git rev-parse`` in the package's own directory first (a clone or an editable install). A copy made by
``git archive`` (a release tarball, or the snapshots our sweeps run from) has no ``.git``; for it ``posttrain/COMMIT``
is marked ``export-subst`` in ``.gitattributes``, so ``git archive`` writes the commit into it. Anything else (a
plain copy of the files, an install from one) is ``"unknown"``, never a guess.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
COMMIT_FILE = PACKAGE_DIR / "COMMIT"


def _git(package_dir: Path, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(package_dir), *args], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def archived_commit(path: Path = COMMIT_FILE) -> str | None:
    """The full hash ``git archive`` wrote into ``path``; None where it is still the placeholder or missing."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    h = text.split()[0] if text else ""
    return h if len(h) == 40 and all(c in "0123456789abcdef" for c in h) else None


def _in_checkout(package_dir: Path) -> bool:
    """The package directory is tracked by the enclosing git repository: posttrain's own clone, not a virtual
    environment that happens to sit inside some other repository."""
    return _git(package_dir, "ls-files", "--error-unmatch", "__init__.py") is not None


def git_commit(short: bool = True, package_dir: Path = PACKAGE_DIR) -> str:
    """The commit of the posttrain tree at ``package_dir`` (this one by default; ``short``: 7 characters): its
    checkout's HEAD, else the one ``git archive`` wrote, else ``"unknown"``."""
    head = _git(package_dir, "rev-parse", "HEAD") if _in_checkout(package_dir) else None
    full = head or archived_commit(package_dir / "COMMIT")
    if full is None:
        return "unknown"
    return full[:7] if short else full


def git_dirty(package_dir: Path = PACKAGE_DIR) -> bool | None:
    """Tracked files changed since the commit (None where there is no git checkout)."""
    if not _in_checkout(package_dir):
        return None
    out = _git(package_dir, "status", "--porcelain", "--untracked-files=no")
    return None if out is None else bool(out)
