"""Dataclass configs, resolved as: dataclass defaults <- preset <- config file (YAML/TOML) <- CLI flags.

Every command's config is a (possibly nested) dataclass whose fields carry their help text in
``metadata["help"]`` (use :func:`knob`). The same dataclass is what the Python API takes; the CLI only
turns flags into it. Flags are generated from the fields: top-level ``num_generations`` becomes
``--num-generations``; a nested ``model.n_layer`` becomes ``--model.n-layer``.

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
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml

from posttrain.errors import ConfigError, UserError


def knob(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = None, choices: tuple | None = None):
    """A dataclass field with help text (shown by ``--help``) and optional allowed values."""
    meta = {"help": help}
    if choices is not None:
        meta["choices"] = tuple(choices)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def check_choice(name: str, value: Any, choices) -> None:
    """Raise a ConfigError naming the field unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


def check_positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name}={value!r} must be {'>= 0' if allow_zero else '> 0'}")


# ---------------------------------------------------------------------------------------------
# field walking


def _fields(cls) -> list[tuple[dataclasses.Field, Any]]:
    hints = get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls) if f.init]


def _is_dataclass_type(tp) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def leaf_fields(cls, prefix: str = "") -> list[tuple[str, dataclasses.Field, Any]]:
    """All non-dataclass fields as (dotted_name, field, type), nested dataclasses flattened."""
    out = []
    for f, tp in _fields(cls):
        name = prefix + f.name
        if _is_dataclass_type(tp):
            out.extend(leaf_fields(tp, name + "."))
        else:
            out.append((name, f, tp))
    return out


def _strip_optional(tp):
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def coerce(name: str, value: Any, tp) -> Any:
    """Convert ``value`` (from a flag string or a parsed file) to the field's type, or raise ConfigError."""
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
            items = [coerce(name, v, item_tp) for v in value]
            return tuple(items) if origin is tuple else items
        if origin is dict or base is dict:
            if isinstance(value, str):
                value = json.loads(value)
            if not isinstance(value, dict):
                raise ValueError
            return value
    except ConfigError:
        raise
    except (ValueError, TypeError, json.JSONDecodeError):
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
            kwargs[k] = coerce(prefix + k, v, tp)
    # nested dataclasses not mentioned keep their defaults
    return cls(**kwargs)


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def load_config_file(path: str | Path) -> dict:
    """Read a YAML (.yaml/.yml) or TOML (.toml) config file into a dict; JSON is YAML."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file not found: {p}")
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix == ".toml":
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # pragma: no cover
                import tomli as tomllib
            data = tomllib.loads(text)
        else:
            data = yaml.safe_load(text) or {}
    except Exception as e:  # yaml/toml errors carry line numbers in their message
        raise UserError(f"{p}: cannot parse config: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"{p}: a config file must hold a mapping of field: value")
    return data


def build_config(cls, preset: dict | None = None, file: str | Path | None = None, overrides: dict[str, Any] | None = None):
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


def add_config_flags(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    """Add one ``--flag`` per leaf field of ``cls``; values stay strings until :func:`build_config`."""
    group = parser.add_argument_group(f"{cls.__name__} fields (override preset and --config)")
    for name, f, tp in leaf_fields(cls):
        if name in skip:
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        )
        help_text = f.metadata.get("help", "")
        choices = f.metadata.get("choices")
        if choices:
            help_text += f" {{{', '.join(map(str, choices))}}}"
        group.add_argument(
            flag_name(name),
            *([("--" + name)] if "_" in name else []),
            dest="cfg:" + name,
            default=argparse.SUPPRESS,
            metavar=getattr(_strip_optional(tp)[0], "__name__", "V").upper(),
            help=f"{help_text} (default: {default})",
        )


def overrides_from_args(args: argparse.Namespace) -> dict[str, str]:
    return {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg:")}


def dump_yaml(cfg) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None)
