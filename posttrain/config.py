"""Dataclass configs, resolved as: dataclass defaults <- preset <- config file (YAML/TOML) <- CLI flags.

Every command's config is a (possibly nested) dataclass whose fields carry their help text in
``metadata["help"]`` (use :func:`knob`). The same dataclass is what the Python API takes; the CLI only
turns flags into it. Flags are generated from the fields: top-level ``num_generations`` becomes
``--num-generations``; a nested ``model.n_layer`` becomes ``--model.n-layer``.

Validation is declared once, on the field: ``knob(1e-3, "learning rate", gt=0)``. The declaration gives
the flag, its ``--help`` text ("... [> 0]") and the check, which :func:`check_fields` runs from each
config's ``__post_init__`` (so the Python API is checked exactly like the CLI). Every float, including
floats inside list and dict fields, must be finite: NaN is never accepted, and +-inf only where a knob
says ``allow_inf=True`` (a bound that may be switched off). Flag strings and config-file values are
rejected already in :func:`coerce`. ``__post_init__`` keeps only cross-field checks. The declaration and its
checks live in :mod:`posttrain.knobs` (every name there is also importable from here).
Not handled: type checks of values passed through the Python API without bounds (a str given for an
unbounded float field is not caught here).

Worked example::

    @dataclass
    class Cfg:
        steps: int = knob(100, "optimizer steps")
    build_config(Cfg, preset={"steps": 50}, overrides={"steps": "7"})  ->  Cfg(steps=7)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

from posttrain.errors import ConfigError, UserError
from posttrain.knobs import (  # declaring and checking a field; knob ... leaf_fields are imported from here too
    bounds_text,
    check_choice,  # noqa: F401
    check_fields,  # noqa: F401
    check_finite,
    check_positive,  # noqa: F401
    check_value,  # noqa: F401
    knob,  # noqa: F401
    leaf_fields,
)
from posttrain.knobs import init_fields as _fields
from posttrain.knobs import is_dataclass_type as _is_dataclass_type
from posttrain.knobs import strip_optional as _strip_optional
from posttrain.knobs import type_hints as _hints  # noqa: F401  (run_dir reads C._hints)


def coerce(name: str, value: Any, tp, meta: dict | None = None) -> Any:
    """Convert ``value`` (from a flag string or a parsed file) to the field's type, or raise ConfigError.

    Floats (also inside lists and dicts) must be finite unless ``meta`` (the knob's metadata) allows inf:
    ``coerce("lr", "inf", float)`` raises "lr=inf is not a finite number".
    """
    out = _coerce(name, value, tp)
    check_finite(name, out, bool((meta or {}).get("allow_inf")))
    return out


def _coerce(name: str, value: Any, tp) -> Any:
    base, optional = _strip_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{name} may not be null")
    if isinstance(value, str) and optional and value.lower() in ("none", "null"):
        return None
    origin = get_origin(base)
    try:
        if base is bool:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if base is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if base is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if base is str:
            if isinstance(value, (bool, list, dict)):  # never their str(): "True", "[1]", "{'a': 1}"
                raise ValueError
            return str(value)
        if origin is Literal:
            allowed = get_args(base)
            if value not in allowed:
                raise ConfigError(f"{name}={value!r} is not valid; choose one of: {', '.join(map(str, allowed))}")
            return value
        if origin in (list, tuple):
            (item_tp, *_) = get_args(base) or (str,)
            if isinstance(value, str):
                value = [v for v in value.split(",") if v.strip() != ""]
            items = [_coerce(name, v, item_tp) for v in value]
            return tuple(items) if origin is tuple else items
        if origin is dict or base is dict:
            if isinstance(value, str):
                value = json.loads(value)
            if not isinstance(value, dict):
                raise ValueError
            return value
    except ConfigError:
        raise
    except (ValueError, TypeError, OverflowError, json.JSONDecodeError):
        tname = getattr(base, "__name__", str(base))
        raise ConfigError(f"{name}={value!r} is not a valid {tname}") from None
    return value


def _merge(dst: dict, src: dict) -> dict:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v
    return dst


class Preset(dict):
    """A named starting config: the values it sets (a plain dict to :func:`build_config`) and ``when``, the one line
    that tells a user when to choose it (``--preset``'s help and the CLI reference list it).

    ``Preset("a quick check", {"steps": 50})["steps"] -> 50``; ``.when -> "a quick check"``.
    """

    def __init__(self, when: str, values: dict | None = None):
        super().__init__(values or {})
        self.when = when


def _nest(flat: dict[str, Any]) -> dict:
    """{"model.n_layer": 2, "steps": 5} -> {"model": {"n_layer": 2}, "steps": 5}"""
    out: dict = {}
    for key, v in flat.items():
        parts = key.split(".")
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = v
    return out


def from_dict(cls, data: dict, prefix: str = ""):
    """Build dataclass ``cls`` from a nested dict, checking names and types; unknown keys are errors."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {type(data).__name__}")
    known = {f.name: (f, tp) for f, tp in _fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown config field {prefix}{unknown[0]!s}; valid fields: {', '.join(prefix + k for k in known)}"
        )
    kwargs = {}
    for k, v in data.items():
        f, tp = known[k]
        if _is_dataclass_type(tp):
            kwargs[k] = from_dict(tp, v, prefix + k + ".")
        else:
            kwargs[k] = coerce(prefix + k, v, tp, f.metadata)
    # nested dataclasses not mentioned keep their defaults
    return cls(**kwargs)


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def load_config_file(path: str | Path) -> dict:
    """Read a YAML (.yaml/.yml) or TOML (.toml) config file into a dict; JSON is YAML.

    Errors are one line ``FILE:LINE: ...``: invalid UTF-8 (the line of the first bad byte) and YAML/TOML
    syntax errors (the parser's line and column).
    """
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file not found: {p}")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise UserError(f"{p}: cannot read config: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise UserError(f"{p}:{line}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {col})") from None
    try:
        if p.suffix == ".toml":
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # pragma: no cover
                import tomli as tomllib
            data = tomllib.loads(text)
        else:
            data = yaml.safe_load(text) or {}
    except Exception as e:
        raise UserError(_parse_error(p, e)) from None
    if not isinstance(data, dict):
        raise UserError(f"{p}: a config file must hold a mapping of field: value")
    return data


def _parse_error(p: Path, e: Exception) -> str:
    """``FILE:LINE: cannot parse config: PROBLEM (column C)`` from a YAML or TOML error."""
    mark = getattr(e, "problem_mark", None)
    if mark is not None:  # yaml.MarkedYAMLError: 0-based line/column of the problem (and of its context)
        where = f"column {mark.column + 1}"
        context, cmark = getattr(e, "context", None), getattr(e, "context_mark", None)
        if context:
            where += f"; {context}" + (f" started at line {cmark.line + 1}" if cmark is not None else "")
        return f"{p}:{mark.line + 1}: cannot parse config: {e.problem} ({where})"
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)", msg)  # tomllib puts the position in the message
    if m:
        return f"{p}:{m.group(1)}: cannot parse config: {msg[: m.start()]} (column {m.group(2)})"
    return f"{p}: cannot parse config: {msg}"


def build_config(
    cls, preset: dict | None = None, file: str | Path | None = None, overrides: dict[str, Any] | None = None
):
    """defaults <- preset <- file <- overrides (dotted keys allowed in overrides)."""
    merged: dict = {}
    if preset:
        _merge(merged, json.loads(json.dumps(preset)))
    if file:
        _merge(merged, load_config_file(file))
    if overrides:
        _merge(merged, _nest(overrides))
    return from_dict(cls, merged)


# ---------------------------------------------------------------------------------------------
# argparse integration


def flag_name(dotted: str) -> str:
    return "--" + dotted.replace("_", "-")


TRL_FLAGS: dict[str, str] = {
    "lr": "--learning-rate",
    "steps": "--max-steps",
    "grad_accum": "--gradient-accumulation-steps",
    "max_new_tokens": "--max-completion-length",  # TRL's GRPO/RLOO/PPO: the generation length
}
"""Our field -> the TRL ``TrainingArguments`` spelling accepted as one more flag for it (where the config does not
already have a field of that name: DPO's and the RM's ``max_completion_length`` is their own, as in TRL)."""

PER_DEVICE_BATCH = "per_device_train_batch_size"


def _trl_spellings(name: str, cls) -> list[str]:
    trl = TRL_FLAGS.get(name)
    if trl is None or trl[2:].replace("-", "_") in {f.name for f in dataclasses.fields(cls)}:
        return []
    return [trl, "--" + trl[2:].replace("-", "_")]


def add_config_flags(
    parser: argparse.ArgumentParser,
    cls,
    skip: tuple[str, ...] = (),
    *,
    switches: bool = False,
    title: str | None = None,
    trl: bool = False,
) -> None:
    """Add one ``--flag`` per leaf field of ``cls``; values stay strings until :func:`build_config`.

    With ``switches`` a bool field is a switch pair (``--bloom`` / ``--no-bloom``) instead of taking a value
    (``--bloom true``), and a tuple or list field takes one or more values (``--contamination A.jsonl B.jsonl``).
    Without it a bool field is a switch that also takes a value: ``--merge-lora``, ``--merge-lora true`` and
    ``--no-merge-lora``. TRL's names are more spellings of the same flags (:data:`TRL_FLAGS`), and a config with a
    ``batch_size`` takes ``--per-device-train-batch-size B`` (batch_size = B x grad_accum x processes); both only
    with ``trl`` (the trainers: a dedup batch is not a training batch)."""
    group = parser.add_argument_group(title or f"{cls.__name__} fields (override preset and --config)")
    for name, f, tp in leaf_fields(cls):
        if name in skip:
            continue
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        )
        help_text = f.metadata.get("help", "")
        choices = f.metadata.get("choices")
        if choices:
            help_text += f" {{{', '.join(map(str, choices))}}}"
        if f.metadata.get("bounds"):
            help_text += f" [{bounds_text(f.metadata['bounds'])}]"
        base = _strip_optional(tp)[0]
        kind: dict[str, Any] = {"metavar": getattr(base, "__name__", "V").upper()}
        if switches and base is bool:
            kind = {"action": argparse.BooleanOptionalAction}
        elif base is bool and "." not in name:
            kind = {"nargs": "?", "const": "true", "metavar": "BOOL"}
            group.add_argument(
                "--no-" + name.replace("_", "-"),
                dest="cfg:" + name,
                action="store_const",
                const="false",
                default=argparse.SUPPRESS,
                help=argparse.SUPPRESS,
            )
            help_text += f" (a switch: {flag_name(name)} / --no-{name.replace('_', '-')}, or a value true/false)"
        elif switches and get_origin(base) in (tuple, list):
            item = (get_args(base) or (str,))[0]
            kind = {"nargs": "+", "metavar": getattr(item, "__name__", "V").upper()}
        group.add_argument(
            flag_name(name),
            *([("--" + name)] if "_" in name and "action" not in kind else []),
            *([f.metadata["flag"]] if f.metadata.get("flag") else []),
            *(_trl_spellings(name, cls) if trl and "." not in name else []),
            dest="cfg:" + name,
            default=argparse.SUPPRESS,
            help=f"{help_text} (default: {default})".replace("%", "%%"),  # argparse %-formats help
            **kind,
        )

    names = {n for n, _, _ in leaf_fields(cls)}
    if trl and "batch_size" in names and "batch_size" not in skip:
        accum = " x --grad-accum (as given here)" if "grad_accum" in names else ""
        group.add_argument(
            "--per-device-train-batch-size",
            "--" + PER_DEVICE_BATCH,
            dest="trl:" + PER_DEVICE_BATCH,
            type=int,
            metavar="B",
            default=argparse.SUPPRESS,
            help=f"TRL's spelling of the batch: sets --batch-size to B{accum} x processes (torchrun's WORLD_SIZE)",
        )


def overrides_from_args(args: argparse.Namespace) -> dict[str, str]:
    """{field: flag value}; TRL's ``--per-device-train-batch-size B`` becomes ``batch_size`` = B x the
    ``--grad-accum`` given with it (1 if none) x WORLD_SIZE (1 outside torchrun)."""
    out = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg:")}
    per_device = getattr(args, "trl:" + PER_DEVICE_BATCH, None)
    if per_device is not None:
        if "batch_size" in out:
            raise ConfigError("--batch-size and --per-device-train-batch-size both given; pass one")
        if per_device <= 0:
            raise ConfigError(f"--per-device-train-batch-size={per_device} must be > 0")
        accum = coerce("grad_accum", out.get("grad_accum", 1), int, {})
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        out["batch_size"] = str(per_device * accum * world)
    return out


def dump_yaml(cfg) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None)


def resolved_dict(cfg) -> dict:
    """The config as a run prints and saves it: :func:`to_dict` less each top-level field whose knob's
    ``unused_with`` names a field that is set. Example: an SFT config with ``data="d.jsonl"`` -> no ``task``
    section (the embedded task's digits, demonstrations...), since nothing reads it."""
    out = to_dict(cfg)
    for f in dataclasses.fields(cfg):
        if any(getattr(cfg, other, None) for other in f.metadata.get("unused_with", ())):
            out.pop(f.name, None)
    return out


def resolved_yaml(cfg) -> str:
    """:func:`resolved_dict` as YAML (what ``config.resolved.yaml`` holds and a run prints)."""
    return yaml.safe_dump(resolved_dict(cfg), sort_keys=False, default_flow_style=None)
