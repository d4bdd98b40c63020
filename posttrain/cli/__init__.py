"""The ``posttrain`` command line: one subcommand per module in this package.

Each module ``posttrain/cli/<name>.py`` (no leading underscore) defines

    NAME = "sft"                     # the subcommand (defaults to the module name)
    HELP = "one line for --help"
    def add_arguments(parser): ...   # flags; usually config.add_config_flags(parser, SomeConfig)
    def run(args) -> int: ...        # parse flags into the dataclass config, call the Python API

Modules keep heavy imports (torch, trainers) inside ``run`` so ``posttrain --help`` stays fast.
A :class:`posttrain.errors.UserError` becomes one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from posttrain import __version__
from posttrain.errors import UserError


def _command_modules():
    pkg = sys.modules[__name__]
    mods = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        mods.append(importlib.import_module(f"{__name__}.{info.name}"))
    return mods


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posttrain",
        description="LLM post-training from raw text to an aligned model: dedup, tokenizers, SFT, RM, RL, DPO.",
    )
    parser.add_argument("--version", action="version", version=f"posttrain {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for mod in _command_modules():
        name = getattr(mod, "NAME", mod.__name__.rsplit(".", 1)[-1])
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run, _cmd=name)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except UserError as e:
        print(f"posttrain {args._cmd}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"posttrain {args._cmd}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
