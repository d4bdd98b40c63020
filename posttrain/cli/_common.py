"""Pieces shared by subcommands: config resolution from preset/file/flags and the printed config."""

from __future__ import annotations

import argparse
from pathlib import Path

from posttrain import config as C
from posttrain.errors import UserError


def add_preset_flags(parser: argparse.ArgumentParser, presets: dict[str, dict], default: str = "tiny") -> None:
    parser.add_argument(
        "--preset", default=default, help=f"named starting config: {', '.join(presets)} (default: {default})"
    )
    parser.add_argument("--config", metavar="FILE", help="YAML or TOML file overriding the preset")


def resolve(cls, presets: dict[str, dict], args: argparse.Namespace, **fixed):
    """preset <- --config file <- flags <- ``fixed`` (values from positional args or dedicated flags)."""
    if args.preset not in presets:
        raise UserError(f"unknown preset {args.preset!r}; available: {', '.join(presets)}")
    overrides = C.overrides_from_args(args)
    overrides.update({k: v for k, v in fixed.items() if v is not None})
    return C.build_config(cls, presets[args.preset], args.config, overrides)


def announce(cfg, out: str | Path | None = None) -> None:
    """Print the resolved config (and where outputs go) so a run's log says what it ran."""
    print("resolved config:")
    for line in C.dump_yaml(cfg).rstrip().splitlines():
        print("  " + line)
    if out is not None:
        print(f"outputs -> {out}")
