"""The one-line readers of a checkpoint's files: every failure is a :class:`~posttrain.errors.UserError` naming the file.

:func:`load_tensors` (safetensors), :func:`load_torch_state` (``*.pt``: optimizer and RNG state, loaded with
``weights_only=True``, so a pickle holding Python objects other than tensors and plain containers is refused),
:func:`read_json` (a JSON object with the keys it must hold; :func:`~posttrain.checkpoints.layout.read_json_file`
without torch); :func:`reading` wraps any other read. A missing, empty, truncated or garbage file gives one line such as
``ckpt/optimizer.pt: corrupt or unreadable checkpoint file (...)``; torch's own message (which suggests
``weights_only=False``) is never shown.
"""

from __future__ import annotations

import contextlib
import json
import pickle
from pathlib import Path

import torch
from safetensors.torch import load_file

from posttrain.checkpoints.layout import read_json_file
from posttrain.errors import UserError


def failure_reason(e: BaseException) -> str:
    """A short one-line reason for a failed read; never torch's advice to unpickle with weights_only=False."""
    if isinstance(e, pickle.UnpicklingError) or "weights_only" in str(e):
        return (
            "refused: it holds Python objects other than tensors and plain containers, which posttrain never unpickles"
        )
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()] or [""]
    text = lines[0] + (" " + lines[1] if lines[0].endswith(":") and len(lines) > 1 else "")
    text = text.split(". ")[0].strip()
    if not text:
        return f"{type(e).__name__}: empty or truncated"
    return text if len(text) <= 160 else text[:157] + "..."


@contextlib.contextmanager
def reading(path: Path):
    """Turn any failure while reading checkpoint file ``path`` into a one-line UserError naming it."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"{path}: corrupt or unreadable checkpoint file ({failure_reason(e)})") from None


def torch_load_dict(path: Path, **kw) -> dict:
    """A ``*.pt`` dict loaded with ``weights_only=True``; any failure is a one-line UserError naming ``path``."""
    with reading(path):
        obj = torch.load(path, weights_only=True, **kw)
    if not isinstance(obj, dict):
        raise UserError(f"{path}: corrupt checkpoint file (expected a dict, got {type(obj).__name__})")
    return obj


def load_torch_state(path: str | Path, **kw) -> dict:
    """A ``*.pt`` state (optimizer, RNG) loaded with ``weights_only=True``; a missing, truncated or pickled-object
    file is a one-line UserError naming it (never torch's advice to pass ``weights_only=False``)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: missing checkpoint file")
    return torch_load_dict(path, **kw)


def load_tensors(path: str | Path, device="cpu") -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; a missing, truncated or corrupt file is a one-line UserError naming it
    (not a SafetensorError)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: missing checkpoint file")
    with reading(path):
        return load_file(str(path), device=str(device))


def read_json(path: str | Path, what: str = "file", keys: dict | None = None) -> dict:
    """A JSON object from ``path`` with the ``keys`` it must hold ({name: type or tuple of types}); anything else
    (missing, empty, not JSON, not an object, a key absent or of another type) is a one-line UserError naming
    the file. Example: ``read_json(p, "summary", {"stages": dict})`` on ``{"stages": 5}`` -> "p: corrupt summary
    ('stages' is 5, expected an object)"."""
    path = Path(path)
    obj = read_json_file(path, what)
    for key, types in (keys or {}).items():
        types = types if isinstance(types, tuple) else (types,)
        value = obj.get(key)
        ok = key in obj and isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            shown = [t for t in types if not (t is int and float in types)]  # (int, float): "a number"
            want = " or ".join(_JSON_NAMES.get(t, t.__name__) for t in shown)
            got = "absent" if key not in obj else f"{_short(value)}"
            raise UserError(f"{path}: corrupt {what} ({key!r} is {got}, expected {want})")
    return obj


_JSON_NAMES = {
    dict: "an object",
    list: "a list",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def _short(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."
