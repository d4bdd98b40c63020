"""The reward contract, enforced where a reward is called: ``fn(prompts, completions, **columns) -> list[float]``.

A reward is user code (``--reward file.py:fn`` / ``module:fn``), so whatever it does is checked at the boundary
and turned into one line (:class:`RewardContractError`, a :class:`~posttrain.errors.UserError`: exit 2) naming
the function, what it returned and for which batch (the n-th call of the run's reward, counted from 1):

    returns None, a dict, a str, a scalar, a set  -> "reward 'r.py:fn' returned a dict {'a': 1.0} for batch 3
                                                      (4 completions): expected a list of 4 numbers, one per completion"
    a 2-D array, nested lists, complex numbers     -> the same, naming the shape or the item that is not a real number
    NaN/Inf, an int too large for a float          -> the same, naming the item
    raises, or calls sys.exit()                    -> "reward 'r.py:fn' raised ValueError: boom on batch 1 (...)"

Accepted: a list or tuple, a 1-D numpy array or torch tensor, or an iterator (a generator), of exactly n real
numbers (int, float, bool, numpy real scalars, one-element real tensors). The function gets deep copies of
``prompts``, ``completions`` and the columns: a reward that edits them in place changes nothing the trainer
uses. Only ``KeyboardInterrupt`` passes through; a :class:`~posttrain.errors.UserError` a reward raises (the
built-in verifiers' one-line errors) passes through unchanged. Training stops at the first broken batch; the
periodic checkpoints written before it stay, so ``--resume`` continues once the reward is fixed. Broken before the
first checkpoint, there is nothing to continue: the same command (or ``--resume``) starts the run again from step 0 in
the same ``--out``, with no ``--overwrite`` (``trainers/run_dir.py``, :func:`~posttrain.trainers.run_dir.unstarted`).

Not handled: a reward that hangs or exhausts memory (no time or memory limit here; the code reward runs its
programs in :mod:`posttrain.rewards.sandbox`), and a reward whose *values* are wrong but well-formed.
"""

from __future__ import annotations

import copy
import itertools
import math
import numbers
from collections.abc import Iterator, Mapping

from posttrain.errors import UserError

SHOWN_CHARS = 60  # of a returned value's repr in the error line


class RewardContractError(UserError):
    """A reward function broke its contract (raised, exited, or returned something other than n finite numbers)."""


def _show(value) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<an integer of {_digits(value)} digits>"  # repr of a huge int is slow, or raises past 4300 digits
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a user object whose __repr__ fails
        text = f"<{type(value).__name__}>"
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _completions(n: int) -> str:
    return f"{n} completion{'' if n == 1 else 's'}"


def describe(value) -> str:
    """``{'a': 1}`` -> "a dict {'a': 1}"; a 2-D array -> "a 2-D ndarray of shape (4, 1)"; None -> "None"."""
    if value is None:
        return "None"
    name = type(value).__name__
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "ndim"):
        return f"a {value.ndim}-D {name} of shape {tuple(shape)}"
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name} {_show(value)}"


def _sequence(out, n: int) -> list | None:
    """``out`` as a list (at most n + 1 items read from an iterator), or None when it is not a flat sequence."""
    if isinstance(out, (list, tuple)):
        return list(out)
    if isinstance(out, (str, bytes, Mapping)) or out is None:
        return None
    ndim = getattr(out, "ndim", None)
    if ndim is not None and hasattr(out, "tolist"):  # numpy array, torch tensor
        return out.tolist() if ndim == 1 else None
    if isinstance(out, Iterator):
        return list(itertools.islice(out, n + 1))
    return None


def _digits(i: int) -> int:
    return max(1, math.ceil(abs(i).bit_length() * math.log10(2)))


def _real(v) -> float | str:
    """``v`` as a float, or a phrase saying why it is not usable: "a complex (1+2j), not a real number"."""
    if hasattr(v, "ndim") and hasattr(v, "item"):  # a 0-d numpy array or a one-element tensor
        if getattr(v, "ndim", 0) != 0 and getattr(v, "numel", lambda: 0)() != 1:
            return f"{describe(v)}, not a real number"
        v = v.item()
    if isinstance(v, numbers.Real):
        try:
            return float(v)
        except OverflowError:
            return f"an integer of {_digits(int(v))} digits, too large for a float"
    return f"{describe(v)}, not a real number"


def check_rewards(fn_name: str, out, n: int, batch_index: int) -> list[float]:
    """The n floats a reward returned, or a :class:`RewardContractError` naming ``fn_name``, the value and the batch.

    Example: ``check_rewards("r.py:fn", {"a": 1.0}, 4, 3)`` -> RewardContractError("reward 'r.py:fn' returned a
    dict {'a': 1.0} for batch 3 (4 completions): expected a list of 4 numbers, one per completion");
    ``check_rewards("r.py:fn", (1, 0.5), 2, 1)`` -> [1.0, 0.5]."""
    where = f"reward {fn_name!r} returned {describe(out)} for batch {batch_index} ({_completions(n)})"
    values = _sequence(out, n)
    if values is None:
        raise RewardContractError(f"{where}: expected a list of {n} numbers, one per completion")
    if len(values) != n:
        got = f"{len(values)}" if len(values) <= n else f"more than {n}"
        raise RewardContractError(f"{where}: {got} values, expected {n} numbers, one per completion")
    floats = []
    for i, v in enumerate(values):
        f = _real(v)
        if isinstance(f, str):
            raise RewardContractError(f"{where}: item {i} is {f}")
        if not math.isfinite(f):
            raise RewardContractError(f"{where}: item {i} is {f}, a non-finite number")
        floats.append(f)
    return floats


_ATOMS = (str, int, float, bool, type(None))  # immutable: a list of them is deep-copied by copying the list


def _deep_copy(v):
    """``copy.deepcopy(v)``; a list or tuple of strings and numbers (the usual prompts, completions and answers) is
    copied as a list, ~20x faster than deepcopy's walk and the same copy (its items cannot be changed in place)."""
    if isinstance(v, (list, tuple)) and all(type(x) in _ATOMS for x in v):
        return list(v) if isinstance(v, list) else tuple(v)
    return copy.deepcopy(v)


def _copies(prompts, completions, columns) -> tuple[tuple, dict]:
    """Deep copies of a reward's inputs; a column value that cannot be deep-copied is copied one level (a list)."""
    args = (_deep_copy(list(prompts)), _deep_copy(list(completions)))
    kwargs = {}
    for k, v in columns.items():
        try:
            kwargs[k] = _deep_copy(v)
        except Exception:  # noqa: BLE001 - e.g. a column of objects holding locks: a shallow copy still protects it
            kwargs[k] = list(v) if isinstance(v, (list, tuple)) else v
    return args, kwargs


def call_reward(fn_name: str, fn, prompts: list, completions: list, columns: dict, batch_index: int) -> list[float]:
    """``fn(prompts, completions, **columns)`` on deep copies, checked by :func:`check_rewards`; whatever it raises
    (``sys.exit`` included; not ``KeyboardInterrupt``, and a UserError as it is) becomes one
    :class:`RewardContractError` line."""
    n = len(completions)
    args, kwargs = _copies(prompts, completions, columns)
    try:
        out = fn(*args, **kwargs)
    except (KeyboardInterrupt, UserError):
        raise
    except SystemExit as e:
        raise RewardContractError(
            f"reward {fn_name!r} called sys.exit({e.code!r}) on batch {batch_index} ({_completions(n)}): a reward "
            f"returns one number per completion"
        ) from None
    except BaseException as e:  # noqa: BLE001 - user code: any failure is reported as one line
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        text = lines[0] if lines else ""
        text = text if len(text) <= 160 else text[:157] + "..."
        raise RewardContractError(
            f"reward {fn_name!r} raised {type(e).__name__}{': ' + text if text else ''} on batch {batch_index} "
            f"({_completions(n)})"
        ) from None
    return check_rewards(fn_name, out, n, batch_index)
