"""The CLI reference, generated from the parser: every command, flag, default, bounds, choices and help text.

``python -m posttrain.cli_reference > docs/reference/cli.md`` (or ``make docs-cli``) writes it; a test fails when the
committed page differs from what the code generates, so the page cannot go stale. Nothing here is written by hand:
the flags come from :func:`posttrain.cli.build_parser`, which builds them from the config dataclasses' knobs (their
help, choices and bounds) and the command modules' own arguments, so the page says what ``posttrain CMD --help`` says.

Not handled: flags whose default depends on the machine would make the page differ between machines; there are none
(a knob's default is a constant of its dataclass).
"""

from __future__ import annotations

import argparse
import re
import sys

HEADER = """# CLI reference

Every `posttrain` command with every flag, generated from the code by `make docs-cli`
(`python -m posttrain.cli_reference > docs/reference/cli.md`); a test fails when this page is stale.
Flags of a config field also take the field's underscore spelling (`--weight_decay`), a `--config FILE`
(YAML/TOML/JSON) sets any of them, and explicit flags win over the file and the `--preset`.
Bounds are written `[lo, hi]` (inclusive) or `(lo, hi)` (exclusive); `{a, b}` lists the choices.
"""

_DEFAULT = re.compile(r"\s*\(default: (.*)\)\s*$", re.S)


def _cell(text: str) -> str:
    """One markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flag_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            long = [o for o in action.option_strings if o.startswith("--")]
            # the dashed spelling first; the underscore alias of a config field is said once in the header
            shown = [o for o in long if "_" not in o[2:]] or long
            names = shown + [o for o in action.option_strings if not o.startswith("--")]
        else:
            names = [action.metavar or action.dest]
        takes = action.nargs != 0
        metavar = action.metavar or (action.dest.upper() if action.option_strings else "")
        if isinstance(metavar, tuple):
            metavar = " ".join(metavar)
        if action.nargs in ("+", "*"):
            metavar = f"{metavar} ..."
        flag = " / ".join(f"`{n}`" for n in names)
        if isinstance(action, argparse.BooleanOptionalAction):
            flag = " / ".join(f"`{n}`" for n in action.option_strings if "_" not in n[2:])
        elif takes and action.option_strings and metavar:
            flag += f" {metavar}"
        help_text = (action.help or "") % {"default": action.default, "prog": "posttrain"}
        m = _DEFAULT.search(help_text)
        if m:
            default, help_text = m.group(1), help_text[: m.start()]
        elif action.default not in (None, argparse.SUPPRESS) and takes:
            default = action.default
        elif not action.option_strings:
            default = "required" if action.nargs not in ("?", "*") else ""
        else:
            default = ""
        if action.choices and "{" not in help_text:
            help_text += " {" + ", ".join(map(str, action.choices)) + "}"
        rows.append(f"| {_cell(flag)} | {_cell(f'`{default}`' if default != '' else '')} | {_cell(help_text)} |")
    return rows


def _command(parser: argparse.ArgumentParser, name: str, help_text: str, level: int) -> list[str]:
    out = [f"{'#' * level} `posttrain {name}`", ""]
    if help_text:
        out += [_cell(help_text), ""]
    rows = _flag_rows(parser)
    if rows:
        out += ["| flag | default | what |", "|---|---|---|", *rows, ""]
    subs = _subparsers(parser)
    helps = {
        a.dest: a.help for p in parser._actions if isinstance(p, argparse._SubParsersAction) for a in p._choices_actions
    }
    for sub, p in subs.items():
        out += _command(p, f"{name} {sub}", helps.get(sub, p.description or ""), level + 1)
    return out


def reference() -> str:
    """The whole page, as markdown."""
    from posttrain.cli import build_parser

    parser = build_parser()
    top = parser._subparsers._group_actions[0]  # the COMMAND choice
    helps = {a.dest: a.help for a in top._choices_actions}
    out = [HEADER, "## Commands", "", "| command | what |", "|---|---|"]
    out += [f"| [`{n}`](#posttrain-{n}) | {_cell(helps.get(n, ''))} |" for n in top.choices]
    out.append("")
    for name, p in top.choices.items():
        out += _command(p, name, helps.get(name, ""), 2)
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
