"""Reward functions by name, and their weighted sum.

Key insight: a reward is a plain function ``fn(prompts, completions, **columns) -> list[float]``; the trainer
only ever sees one such function, the weighted sum ``R = sum_k w_k * fn_k``, and logs each component.

``REWARD_FUNCTIONS`` maps a name to a *factory* taking keyword options (unknown options are ignored, so one
options dict can serve several rewards) and returning the reward function:

    REWARD_FUNCTIONS["math"]()                                  -> math_answer_reward
    REWARD_FUNCTIONS["overlength"](max_length=64, buffer=16)     -> a DAPO over-length penalty
    build_reward("math:1.0,format:0.1")                          -> WeightedReward

``reward_model`` (a ``posttrain rm`` checkpoint, ``rm_path=DIR``) is listed here like the others; its module
(:mod:`posttrain.rewards.reward_model`: torch, a checkpoint reader) is imported only when it is built, and
built once per :func:`build_reward` call (one RM load per run). How a trainer config's ``reward`` spec and
``reward_model`` path combine is :func:`resolve_reward_spec` (the same rule for every RL trainer):

    resolve_reward_spec(DEFAULT, "runs/rm", default=DEFAULT)       -> "reward_model:1.0"
    resolve_reward_spec("reward_model:1.0,format:0.1", "runs/rm")  -> unchanged
    resolve_reward_spec("reward_model", None)                      -> ConfigError (no path)
    resolve_reward_spec("exact_match", "runs/rm")                  -> ConfigError (the RM would be ignored)

Rewards from Python: a spec item ``MODULE:FUNCTION`` names a callable ``fn(prompts, completions, **columns)
-> list[float]`` (or TRL's ``fn(completions, **kwargs)``: a function naming a ``completions`` parameter is
called by keyword, as TRL calls it; every Python reward gets conversational rows as message lists, as TRL
hands them) in an importable module (``my_rewards:length_bonus``, ``pkg.sub:fn``) or in a file
(``path/to/rewards.py:fn``), beside the built-ins:

    spec  := item ("," item)*
    item  := NAME [":" WEIGHT]  |  MODULE ":" FUNCTION [":" WEIGHT]
    WEIGHT: a decimal number (1.0, .5, -2, 1e-3); the weight is 1 when absent

The last ``:``-part is a weight only when it is a number (a function name never is), so ``math:0.5``
and ``my_mod:fn`` and ``my_mod:fn:0.5`` read unambiguously (after a built-in name such as ``math`` only a
weight may follow: a module of that name is written ``./math.py:fn``). The module is imported when the reward is
built (the current directory is importable); a missing module or function is a one-line ConfigError. A
function without ``**kwargs`` gets only the columns its signature names. ``answer_field`` (an option of
``exact_match``, ``digits`` and ``math``) names the column they read as the reference (default ``answer``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import re
import sys
from pathlib import Path
from typing import Callable, Protocol

from posttrain.errors import ConfigError, UserError
from posttrain.rewards.contract import call_reward
from posttrain.rewards.verifiers import (
    digits_reward,
    exact_match_reward,
    make_code_reward,
    make_format_reward,
    make_overlength_penalty,
    math_answer_reward,
)


class RewardFunction(Protocol):
    def __call__(self, prompts: list[str], completions: list[str], **columns) -> list[float]: ...


def _reading(fn, answer_field: str, **fixed):
    """``fn`` reading its reference from column ``answer_field`` instead of ``answer`` (and ``fixed`` options)."""
    if answer_field == "answer" and not fixed:
        return fn

    def reward(prompts, completions, **columns):
        cols = {k: v for k, v in columns.items() if k != "answer"}
        return fn(prompts, completions, **{**cols, "answer": columns.get(answer_field), **fixed})

    reward.__name__ = getattr(fn, "__name__", "reward")
    return reward


def _exact_match(answer_field: str = "answer", **_):
    return _reading(exact_match_reward, answer_field)


def _digits(answer_field: str = "answer", **_):
    return _reading(digits_reward, answer_field)


def _math(backend: str = "auto", answer_field: str = "answer", **_):
    return _reading(math_answer_reward, answer_field, **({} if backend == "auto" else {"backend": backend}))


def _reward_model(**options):
    from posttrain.rewards.reward_model import reward_model_reward  # lazy: torch and a checkpoint reader

    return reward_model_reward(**options)


REWARD_FUNCTIONS: dict[str, Callable[..., RewardFunction]] = {
    "exact_match": _exact_match,
    "digits": _digits,
    "math": _math,
    "format": make_format_reward,
    "overlength": make_overlength_penalty,
    "code": make_code_reward,
    "reward_model": _reward_model,
}


def register_reward(name: str, factory: Callable[..., RewardFunction]) -> None:
    """Add a reward factory under ``name`` (e.g. the reward-model reward); refuses to overwrite silently."""
    if name in REWARD_FUNCTIONS and REWARD_FUNCTIONS[name] is not factory:
        raise ValueError(f"a reward named {name!r} is already registered")
    REWARD_FUNCTIONS[name] = factory


_WEIGHT = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def is_python_reward(name: str) -> bool:
    """``module:function`` (or ``file.py:function``): a reward imported from Python, not a built-in name."""
    return ":" in name


def _check_python_name(name: str, spec: str) -> None:
    mod, _, fn = name.rpartition(":")
    if not (mod.endswith(".py") or _DOTTED.fullmatch(mod)) or not re.fullmatch(r"[A-Za-z_]\w*", fn):
        raise ConfigError(
            f"reward {name!r} is not MODULE:FUNCTION (e.g. my_rewards:length_bonus, or "
            f"rewards.py:length_bonus) nor a built-in name (spec: {spec!r})"
        )


def load_python_reward(name: str) -> RewardFunction:
    """The callable ``MODULE:FUNCTION`` names (``MODULE`` dotted and importable, or a ``.py`` file), wrapped so a
    function without ``**kwargs`` gets only the columns it names; ConfigError when it cannot be loaded."""
    mod_name, _, fn_name = name.rpartition(":")
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name)
            if not path.is_file():
                raise ConfigError(f"reward {name!r}: no file {mod_name}")
            spec = importlib.util.spec_from_file_location(f"posttrain_user_reward_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            if "" not in sys.path and "." not in sys.path:
                sys.path.insert(0, "")  # the current directory, as `python -m` has it
            module = importlib.import_module(mod_name)
    except ConfigError:
        raise
    except ModuleNotFoundError as e:
        raise ConfigError(
            f"reward {name!r}: cannot import module {mod_name!r} ({e}); is it on PYTHONPATH or in the "
            f"current directory?"
        ) from None
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's module failed (or exited) while importing
        raise ConfigError(f"reward {name!r}: importing {mod_name!r} failed: {type(e).__name__}: {e}") from None
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise ConfigError(f"reward {name!r}: module {mod_name!r} has no {fn_name!r}")
    if not callable(fn):
        raise ConfigError(f"reward {name!r}: {mod_name}.{fn_name} is a {type(fn).__name__}, not a function")
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn
    every = any(p.kind is p.VAR_KEYWORD for p in params)
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    by_name = "completions" in named  # TRL's convention: fn(prompts=..., completions=..., **kwargs), by keyword

    def reward(prompts, completions, **columns):
        cols = columns if every else {k: v for k, v in columns.items() if k in named}
        if by_name:
            return fn(**({"prompts": prompts} if every or "prompts" in named else {}), completions=completions, **cols)
        return fn(prompts, completions, **cols)

    reward.conversational = True  # gets message lists for conversational rows (WeightedReward.components)
    return reward


def get_reward(name: str, **options) -> RewardFunction:
    if is_python_reward(name):
        return load_python_reward(name)
    if name not in REWARD_FUNCTIONS:
        raise ConfigError(f"unknown reward {name!r}; choose from: {', '.join(sorted(REWARD_FUNCTIONS))}")
    return REWARD_FUNCTIONS[name](**options)


class WeightedReward:
    """R = sum_k w_k * fn_k(prompts, completions, **columns); also a reward function itself.

    ``components`` returns the total and each named component (for per-reward metrics). Each component is
    called through :func:`posttrain.rewards.contract.call_reward` (copies of the inputs; one finite float per
    completion, or a one-line error naming the reward, what it returned and the batch: ``batches`` counts calls).
    """

    def __init__(self, terms: dict[str, tuple[RewardFunction, float]]):
        if not terms:
            raise ConfigError("at least one reward function is needed")
        self.terms = dict(terms)
        self.batches = 0  # calls so far: the batch an error names

    def components(self, prompts: list[str], completions: list[str], chats=None, /, **columns):
        """(total, {name: values}). ``chats``: (prompts, completions) as TRL hands them for conversational rows
        (message lists; :func:`posttrain.data.prompts.chat_views`), given to the Python rewards; the built-in
        ones always read ``prompts`` and ``completions`` as text."""
        if len(prompts) != len(completions):
            raise UserError(f"{len(prompts)} prompts for {len(completions)} completions")
        total = [0.0] * len(completions)
        parts = {}
        self.batches += 1
        for name, (fn, weight) in self.terms.items():
            ps, cs = chats if chats is not None and getattr(fn, "conversational", False) else (prompts, completions)
            values = call_reward(name, fn, ps, cs, columns, self.batches)
            parts[name] = values
            total = [t + weight * v for t, v in zip(total, values)]
        if not all(math.isfinite(t) for t in total):
            raise UserError(f"the weighted reward overflowed (not finite) on batch {self.batches}: {_weights(self)}")
        return total, parts

    def __call__(self, prompts: list[str], completions: list[str], **columns) -> list[float]:
        return self.components(prompts, completions, **columns)[0]

    def reweighted(self, weights: dict[str, float]) -> "WeightedReward":
        """The same functions (not rebuilt: a loaded reward model is shared) under new weights, for the named
        terms only: ``R.reweighted({"digits": 0.2})`` is 0.2 * digits."""
        unknown = sorted(set(weights) - set(self.terms))
        if unknown:
            raise ConfigError(f"reward terms {unknown} are not in this reward (terms: {', '.join(self.terms)})")
        return WeightedReward({name: (self.terms[name][0], w) for name, w in weights.items()})


def _weights(r: WeightedReward) -> str:
    return ", ".join(f"{name}:{w:g}" for name, (_, w) in r.terms.items())


def _split_item(item: str, spec: str) -> tuple[str, float]:
    """ "math:0.5" -> ("math", 0.5); "mod:fn" -> ("mod:fn", 1.0); "mod:fn:2" -> ("mod:fn", 2.0)."""
    head, sep, last = item.rpartition(":")
    last = last.strip()
    if sep and _WEIGHT.fullmatch(last):
        return head.strip(), float(last)
    if (
        sep
        and not is_python_reward(head)
        and (head.strip() in REWARD_FUNCTIONS or not re.fullmatch(r"[A-Za-z_]\w*", last))
    ):
        raise ConfigError(f"reward weight {last!r} for {head.strip()!r} is not a number (spec: {spec!r})")
    return item.strip(), 1.0


def parse_reward_spec(spec: str) -> dict[str, float]:
    """ "math:1.0, format:0.1" -> {"math": 1.0, "format": 0.1}; a bare name has weight 1; "my_mod:fn:0.5"
    -> {"my_mod:fn": 0.5} (a reward from Python; see the module docstring for the grammar)."""
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, weight = _split_item(item, spec)
        if not math.isfinite(weight):
            raise ConfigError(f"reward weight {weight} for {name!r} is not finite (spec: {spec!r})")
        out[name] = weight
        if is_python_reward(name):
            _check_python_name(name, spec)
        elif name not in REWARD_FUNCTIONS:
            raise ConfigError(f"unknown reward {name!r}; choose from: {', '.join(sorted(REWARD_FUNCTIONS))}")
    if not out:
        raise ConfigError(f"empty reward spec {spec!r}; e.g. 'exact_match:1.0'")
    return out


def python_reward_sources(spec: str) -> dict[str, Path]:
    """The source file of each Python reward a spec names (``name -> path``; found without importing it), so a
    cache key can hold the code's bytes: an edited reward function is a changed input, not a cached stage. Only
    the file that defines the function counts (not the modules it imports); one that cannot be found is left
    out (loading it later raises the ConfigError)."""
    out = {}
    for name in parse_reward_spec(spec):
        if not is_python_reward(name):
            continue
        mod_name = name.rpartition(":")[0]
        if mod_name.endswith(".py"):
            path = Path(mod_name)
        else:
            try:
                found = importlib.util.find_spec(mod_name)
            except (ImportError, ValueError):
                found = None
            path = Path(found.origin) if found is not None and found.origin else None
        if path is not None and path.is_file():
            out[name] = path
    return out


RM_REWARD = "reward_model"


def resolve_reward_spec(spec: str, rm_path: str | None, default: str | None = None) -> str:
    """The reward spec a run uses, given its ``reward`` and ``reward_model`` fields (checked at config time).

    A reward-model path with the spec left at the trainer's ``default`` means ``reward_model:1.0``; any other
    spec must name ``reward_model`` itself when a path is given (else the RM would be loaded and ignored), and
    a spec naming ``reward_model`` needs a path. Idempotent: a resolved spec resolves to itself (resume).
    """
    weights = parse_reward_spec(spec)
    if rm_path and RM_REWARD not in weights:
        if default is not None and spec == default:
            return f"{RM_REWARD}:1.0"
        raise ConfigError(
            f"--reward-model {rm_path} is given but --reward {spec!r} does not use it: add "
            f"'{RM_REWARD}:W' to the spec (e.g. '{RM_REWARD}:1.0,{spec}') or drop --reward"
        )
    if RM_REWARD in weights and not rm_path:
        raise ConfigError(
            f"--reward {spec!r} uses {RM_REWARD}: pass --reward-model RM_CHECKPOINT (a `posttrain rm` output directory)"
        )
    return spec


def build_reward(spec: str | dict[str, float], **options) -> WeightedReward:
    """A weighted reward from a spec string or {name: weight}; ``options`` go to every factory.

    With ``rm_path`` (``build_reward(cfg.reward, rm_path=cfg.reward_model)``) the spec is checked by
    :func:`resolve_reward_spec` (no default substitution here: configs resolve that in ``__post_init__``); the
    reward model is loaded once, here, and its scorer reused for every call.
    """
    weights = parse_reward_spec(spec) if isinstance(spec, str) else dict(spec)
    if "rm_path" in options:
        resolve_reward_spec(",".join(f"{k}:{w}" for k, w in weights.items()), options["rm_path"])
    return WeightedReward({name: (get_reward(name, **options), w) for name, w in weights.items()})
