"""Every relative link in the README and docs/ points at a file that exists, and every #anchor at a heading there.

The docs link their numbers to sections and JSON files by name; a renamed heading or a moved file breaks such a link
silently. Anchors follow GitHub's rule: the heading lower-cased, characters other than letters, digits, spaces,
``-`` and ``_`` dropped, spaces turned into ``-``, a repeated heading suffixed ``-1``, ``-2``, ...
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [
    *(p for p in (ROOT / "README.md", ROOT / "README_draft.md", ROOT / "CHANGELOG.md") if p.exists()),
    *sorted((ROOT / "docs").rglob("*.md")),
]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower())
    return text.replace(" ", "-")


def prose_lines(path: Path, keep_code: bool = False):
    """The file's lines outside fenced code blocks, inline code spans removed (``keep_code``: kept)."""
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield line if keep_code else re.sub(r"`[^`]*`", "", line)


@cache  # each doc's headings are read once, however many links point into it
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    for line in prose_lines(path, keep_code=True):
        if m := re.match(r"^#{1,6}\s+(.*)", line):
            s = slug(m.group(1))
            seen[s] = seen.get(s, -1) + 1
    return frozenset(s if k == 0 else f"{s}-{k}" for s, n in seen.items() for k in range(n + 1))


def test_slug_follows_github():
    assert slug("2026-12-03: an Intel Xeon, the SFT recipe and the prompt filter") == (
        "2026-12-03-an-intel-xeon-the-sft-recipe-and-the-prompt-filter"
    )
    assert slug("Pre-rollout prompt filter (GRESO)") == "pre-rollout-prompt-filter-greso"
    assert slug("Partial credit: the `digits` reward") == "partial-credit-the-digits-reward"
    assert slug("Results on an AVX2 machine (commit 6c68cb2): the defaults, GRPO tail-averaged, seeds 0–4") == (
        "results-on-an-avx2-machine-commit-6c68cb2-the-defaults-grpo-tail-averaged-seeds-04"
    )


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path):
    broken = []
    for line in prose_lines(doc):
        for link in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", link):  # http:, https:, mailto:
                continue
            path, _, fragment = link.partition("#")
            target = (doc.parent / path).resolve() if path else doc
            if not target.exists():
                broken.append(f"{link} (no such file)")
            elif fragment and target.suffix == ".md" and fragment not in anchors(target):
                broken.append(f"{link} (no heading #{fragment} in {target.name})")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)
