"""Pieces shared by subcommands: config resolution from preset/file/flags and the printed config."""

from __future__ import annotations

import argparse
from pathlib import Path

from posttrain import config as C
from posttrain.errors import UserError
from posttrain.tasks.base import USER_FIELDS  # --data / --model: the user's run, no preset


def add_preset_flags(
    parser: argparse.ArgumentParser, presets: dict[str, dict], default: str = "tiny", *, user_data: bool = True
) -> None:
    """``--preset`` and ``--config``; ``user_data``: the command takes ``--data``/``--model``, which start from no
    preset unless ``--preset`` is given (:func:`resolve`)."""
    user = "; none with --data or --model: the presets are recipes for the embedded task" if user_data else ""
    names = "; ".join(f"{n}: {p.when}" if getattr(p, "when", None) else n for n, p in presets.items())
    parser.add_argument(
        "--preset", default=None, help=f"named starting config: {names} (default: {default}{user})".replace("%", "%%")
    )
    parser.add_argument("--config", metavar="FILE", help="YAML or TOML file overriding the preset")
    if user_data:  # a trainer command (announce)
        parser.add_argument(
            "--verbose", action="store_true", help="print the whole resolved configuration before the run starts"
        )
    parser.set_defaults(_preset_default=default)


def resolve(cls, presets: dict[str, dict], args: argparse.Namespace, **fixed):
    """preset <- --config file <- flags <- ``fixed`` (values from positional args or dedicated flags).

    Two rules beside the order:

    - ``--resume DIR``: the run's own saved config, with only the flags given on this command line changed, and
      only those that keep the run what it was (:func:`posttrain.trainers.run_dir.resume_config`); no preset.
    - ``--data`` or ``--model`` (in flags or the ``--config`` file) without an explicit ``--preset``: no preset.
      The presets are recipes tuned on the embedded arithmetic task (the ``tiny`` SFT preset's 2000 steps, weight
      decay 3.0 and restarts); the user's model and data start from the field defaults.
    """
    overrides = C.overrides_from_args(args)
    overrides.update({k: v for k, v in fixed.items() if v is not None})
    if getattr(args, "resume", None):
        if args.preset is not None:
            raise UserError(
                f"--preset {args.preset} with --resume: a resumed run keeps its own saved configuration; drop --preset"
            )
        from posttrain.trainers.run_dir import resume_config

        return resume_config(cls, args.resume, args.config, overrides, command=getattr(args, "_cmd", None))
    name = args.preset
    if name is None:
        given = set(overrides) | set(C.load_config_file(args.config) if args.config else {})
        user = any(k in given for k in USER_FIELDS) and any(n in USER_FIELDS for n, _, _ in C.leaf_fields(cls))
        name = None if user else getattr(args, "_preset_default", "tiny")
    args.preset = name
    if name is not None and name not in presets:
        raise UserError(f"unknown preset {name!r}; available: {', '.join(presets)}")
    return C.build_config(cls, presets[name] if name else None, args.config, overrides)


def announce(cfg, out: str | Path | None = None, *, verbose: bool = False) -> None:
    """One line saying where the resolved config is written (``OUT/config.resolved.yaml``, beside the run's
    outputs); with ``verbose`` the whole config too, so a run's log says what it ran."""
    if verbose or out is None:
        print("resolved config:")
        for line in C.resolved_yaml(cfg).rstrip().splitlines():
            print("  " + line)
    if out is not None:
        print(f"outputs -> {out} (config: {Path(out) / 'config.resolved.yaml'}; --verbose prints it here)")
