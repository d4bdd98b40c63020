"""Everything a user reads speaks the field's words: no internal vocabulary of how the work was organised.

The one list of forbidden words is ``FORBIDDEN`` below. The test reads every tracked (and untracked, not ignored) file a
user can meet: the README and changelog, docs/ (pages, the log, recorded outcomes: their text, and the *keys* of their
JSON records, whose values are the commands as they were run), posttrain/ (strings, comments, docstrings, and so
``--help`` and error messages), benchmarks/, examples/, tests/, the Makefile, pyproject.toml and mkdocs.yml, and
every file's name. A hit names the file, the line and the word.

A few words are legitimate in one technical sense and nowhere else; ``ALLOWED`` names those contexts exactly (a POSIX
process session, pytest's fixture scope, a helper function).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN: dict[str, re.Pattern] = {
    "a work counter ('stop 33')": re.compile(r"\bstops?[ _-]?\d+", re.I),
    "a project nickname ('moonshot')": re.compile(r"moon[ _-]?shot", re.I),
    "a work session": re.compile(r"\bsessions?\b", re.I),
    "a ticket number ('issue 12')": re.compile(r"\b(?:issues?|tickets?)[ _-]?#?\d+", re.I),
    "an agent ('another helper')": re.compile(
        r"\b(?:another|other|fellow|lead|sub)[ -]?helpers?\b|\bhelpers? (?:ran|measured|found|wrote|tried|reported)\b",
        re.I,
    ),
}

# A hit is allowed when its line matches one of these (the technical senses of a word, precisely).
ALLOWED: dict[str, re.Pattern] = {
    "a work session": re.compile(
        r"--new-session|scope=\"session\"|its own session|own process session|os\.setsid|start_new_session"
    )
}

TEXT_SUFFIXES = {".md", ".py", ".txt", ".toml", ".yml", ".yaml", ".cfg", ".sh", ".html", ".css", ""}
JSON_SUFFIXES = {".json", ".jsonl"}
SELF = Path(__file__).resolve()


SKIP_DIRS = set(".git .venv build dist site runs __pycache__ .pytest_cache .hypothesis .ruff_cache".split())


def user_files() -> list[Path]:
    """Tracked files and untracked ones git does not ignore (a fresh clone and a working tree alike); outside a git
    checkout (an sdist, a ``git archive``), every file but build outputs and caches."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return sorted(
            p
            for p in ROOT.rglob("*")
            if p.is_file()
            and not any(part in SKIP_DIRS or part.endswith(".egg-info") for part in p.relative_to(ROOT).parts)
        )
    return sorted({ROOT / p for p in out.split("\0") if p and (ROOT / p).is_file()})


# A word and its number split by a line break ("... of stop\n31") is a hit too.
ACROSS_LINES = re.compile(r"\b(?:stops?|issues?)[ \t]*\n[ \t]*#?\d+", re.I)


def hits(text: str, where: str) -> list[str]:
    found = [
        f"{where}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r} (a counter split across lines)"
        for m in ACROSS_LINES.finditer(text)
    ]
    for n, line in enumerate(text.splitlines(), 1):
        for what, pattern in FORBIDDEN.items():
            if (m := pattern.search(line)) and not (what in ALLOWED and ALLOWED[what].search(line)):
                found.append(f"{where}:{n}: {m.group(0)!r} ({what})")
    return found


def json_keys(value) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in json_keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in json_keys(v)}
    return set()


def test_forbidden_patterns_catch_what_they_should():
    caught = "\n".join(
        [
            "500 by the 5-seed sweep of stop 33",
            "stops 28-33",
            "Stop-37 default",
            "the moonshot preset",
            "this session",
            "issue 14's seeds",
            "another helper measured it",
            "the Xeon of stop",
            "31, and",
        ]
    )
    assert len(hits(caught, "x")) == 8
    fine = "\n".join(
        [
            "bwrap --new-session --cap-drop ALL",
            '@pytest.fixture(scope="session")',
            "the child leads its own session",
            "early stopping at step 300",
            "stop tokens",
            "small file helpers",
            "every helper here is the identity",
            "the issues a user may hit",
        ]
    )
    assert hits(fine, "x") == []


def test_file_names_use_the_fields_words():
    bad = [hit for p in user_files() for hit in hits(str(p.relative_to(ROOT)), "file name")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "top", ["README.md", "README_draft.md", "CHANGELOG.md", "docs", "posttrain", "benchmarks", "examples", "tests"]
)
def test_text_uses_the_fields_words(top: str):
    bad = []
    for path in user_files():
        rel = path.relative_to(ROOT)
        if rel.parts[0] != top and str(rel) != top or path == SELF:
            continue
        if path.suffix in JSON_SUFFIXES:
            text = path.read_text(encoding="utf-8")
            docs = [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" else []
            keys = set().union(*(json_keys(d) for d in docs)) if docs else json_keys(json.loads(text) if text else {})
            bad += hits("\n".join(sorted(keys)), f"{rel} (JSON key)")
        elif path.suffix in TEXT_SUFFIXES:
            bad += hits(path.read_text(encoding="utf-8", errors="replace"), str(rel))
    assert not bad, f"{len(bad)} hits:\n" + "\n".join(bad[:200])


def test_build_files_use_the_fields_words():
    bad = []
    for name in ["Makefile", "pyproject.toml", "mkdocs.yml"]:
        if (ROOT / name).exists():
            bad += hits((ROOT / name).read_text(encoding="utf-8"), name)
    assert not bad, "\n".join(bad)
