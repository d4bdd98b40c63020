"""docs/reference/cli.md is what ``python -m posttrain.cli_reference`` generates from the parser (``make docs-cli``),
and it names every command and every flag that ``posttrain CMD --help`` lists."""

from __future__ import annotations

import re
from pathlib import Path

from posttrain.cli import build_parser
from posttrain.cli_reference import reference

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "cli.md"


def test_the_committed_reference_is_not_stale():
    assert PAGE.read_text(encoding="utf-8") == reference(), (
        "docs/reference/cli.md is stale: run `make docs-cli` (python -m posttrain.cli_reference > docs/reference/cli.md)"
    )


def test_every_flag_of_every_command_is_in_the_reference():
    page = reference()
    top = build_parser()._subparsers._group_actions[0]
    missing = []
    for name, parser in top.choices.items():
        assert f"## `posttrain {name}`" in page
        section = page.split(f"## `posttrain {name}`", 1)[1]
        # the option rows of --help (indented two spaces), not flags named in help prose
        rows = [line for line in parser.format_help().splitlines() if re.match(r"  -", line)]
        for flag in re.findall(r"(--[a-z][a-z0-9._-]*)", "\n".join(rows)):
            if flag != "--help" and "_" not in flag and f"`{flag}`" not in section:  # _: a field's alias
                missing.append(f"{name} {flag}")
    assert not missing, missing
