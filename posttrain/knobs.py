"""Declaring a config field once: :func:`knob` (default, help, bounds, choices, flag) and the checks it implies.

``knob(1e-3, "learning rate", gt=0)`` gives the flag's ``--help`` text ("... [> 0]") and the check that
:func:`check_fields` runs from each config's ``__post_init__``, so the Python API is checked exactly like the CLI.
Every float, including floats inside list and dict fields, must be finite: NaN is never accepted, and +-inf only where
a knob says ``allow_inf=True``. :func:`leaf_fields` walks a nested config's fields (``model.n_layer``).

How configs are resolved from these declarations (presets, config files, flags): :mod:`posttrain.config`, which
also exports every name here.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from typing import Any, get_args, get_origin, get_type_hints

from posttrain.errors import ConfigError


def knob(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    factory: Any = None,
    choices: tuple | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    allow_inf: bool = False,
    flag: str | None = None,
    unused_with: tuple[str, ...] = (),
    check: Any = None,
):
    """A dataclass field with help text (shown by ``--help``), allowed values and numeric bounds.

    ``flag`` is one more spelling of the field's flag (``model_path`` is also ``--model``). ``unused_with`` names
    sibling fields that, when set, make this one unread: it is then left out of :func:`resolved_dict` (the embedded
    task's settings with ``("data", "model_path")``: a run on the user's data does not print or save them).

    ``ge``/``gt``/``le``/``lt`` bound a number (>=, >, <=, <; a None value of an Optional field is not
    bounded). Floats must be finite unless ``allow_inf`` (NaN never is). Example:
    ``knob(0.9, "cosine threshold", ge=-1, le=1)`` -> help "cosine threshold [in [-1, 1]]", and
    ``check_fields`` raises "semantic_threshold=5.0 must be in [-1, 1]".
    """
    meta: dict[str, Any] = {"help": help}
    if choices is not None:
        meta["choices"] = tuple(choices)
    bounds = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None}
    if bounds:
        meta["bounds"] = bounds
    if allow_inf:
        meta["allow_inf"] = True
    if flag is not None:
        meta["flag"] = flag
    if unused_with:
        meta["unused_with"] = tuple(unused_with)
    if check is not None:
        meta["check"] = check  # check(name, value): ConfigError when the value is not valid (a parsed spec)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def check_choice(name: str, value: Any, choices) -> None:
    """Raise a ConfigError naming the field unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


def check_positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    check_value(name, value, bounds={"ge": 0} if allow_zero else {"gt": 0})


def bounds_text(bounds: dict) -> str:
    """{"gt": 0} -> "> 0"; {"ge": 0, "le": 1} -> "in [0, 1]"; {"gt": 0, "lt": 1} -> "in (0, 1)"."""
    lo = ("[", bounds["ge"]) if "ge" in bounds else ("(", bounds["gt"]) if "gt" in bounds else None
    hi = ("]", bounds["le"]) if "le" in bounds else (")", bounds["lt"]) if "lt" in bounds else None
    if lo and hi:
        return f"in {lo[0]}{_num(lo[1])}, {_num(hi[1])}{hi[0]}"
    if lo:
        return f"{'>=' if lo[0] == '[' else '>'} {_num(lo[1])}"
    if hi:
        return f"{'<=' if hi[0] == ']' else '<'} {_num(hi[1])}"
    return ""


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _within(x: float, b: dict) -> bool:
    return not (
        ("ge" in b and not x >= b["ge"])
        or ("gt" in b and not x > b["gt"])
        or ("le" in b and not x <= b["le"])
        or ("lt" in b and not x < b["lt"])
    )


def check_finite(name: str, value: Any, allow_inf: bool = False) -> None:
    """Raise a ConfigError for a NaN (or, unless ``allow_inf``, an infinite) float anywhere in ``value``
    (lists, tuples and dict values are searched; dict entries are named ``name.key``)."""
    if isinstance(value, float):
        if math.isnan(value) or (math.isinf(value) and not allow_inf):
            raise ConfigError(f"{name}={value!r} is not a finite number")
    elif isinstance(value, dict):
        for k, v in value.items():
            check_finite(f"{name}.{k}", v, allow_inf)
    elif isinstance(value, (list, tuple)):
        for v in value:
            check_finite(name, v, allow_inf)


def check_value(
    name: str, value: Any, meta: dict | None = None, *, bounds: dict | None = None, optional: bool = False
) -> None:
    """Check one field value against its knob declaration (choices, finiteness, bounds); ConfigError naming it."""
    meta = meta or {}
    if value is None:
        return
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        check_choice(name, value, choices)
    if meta.get("check") is not None and value is not None:
        meta["check"](name, value)
    check_finite(name, value, meta.get("allow_inf", False))
    bounds = bounds or meta.get("bounds")
    if not bounds:
        return
    for v in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise ConfigError(f"{name}={value!r} is not a number")
        if not _within(v, bounds):
            raise ConfigError(f"{name}={value!r} must be {bounds_text(bounds)}{' (or None)' if optional else ''}")


def check_fields(cfg, prefix: str = "") -> None:
    """Check every (non-dataclass) field of ``cfg`` against its knob: call first thing in ``__post_init__``.

    ``prefix`` names the config where it is nested (``"model."``) so errors read ``model.dropout=...``.
    Nested dataclass fields are skipped: they check themselves when built.
    """
    for f, tp in init_fields(type(cfg)):
        if is_dataclass_type(tp):
            continue
        check_value(prefix + f.name, getattr(cfg, f.name), f.metadata, optional=strip_optional(tp)[1])


# ---------------------------------------------------------------------------------------------
# field walking


@functools.lru_cache(maxsize=None)
def type_hints(cls) -> dict:
    """``cls``'s resolved field annotations (cached: configs are classes, built once)."""
    return get_type_hints(cls)


def init_fields(cls) -> list[tuple[dataclasses.Field, Any]]:
    """(field, resolved type) of each field of dataclass ``cls`` that ``__init__`` takes."""
    hints = type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls) if f.init]


def is_dataclass_type(tp) -> bool:
    """A dataclass class (a nested config section), not an instance."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def leaf_fields(cls, prefix: str = "") -> list[tuple[str, dataclasses.Field, Any]]:
    """All non-dataclass fields as (dotted_name, field, type), nested dataclasses flattened."""
    out = []
    for f, tp in init_fields(cls):
        name = prefix + f.name
        if is_dataclass_type(tp):
            out.extend(leaf_fields(tp, name + "."))
        else:
            out.append((name, f, tp))
    return out


def strip_optional(tp):
    """(T, True) for ``T | None``; (tp, False) otherwise."""
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False
