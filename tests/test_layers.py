"""The package's layering, read from the source: every ``import`` of a posttrain module (function-local
ones included, which is where a cycle hides), resolved to the module it names.

Checked: no import cycle anywhere in ``posttrain/``; no package exports a name that hides one of its
submodules (``posttrain.ops.flash_attention`` was the function, not the module); ``losses/`` imports nothing from
``models/``, ``trainers/`` or ``config.py`` (pure tensor functions); no module over ``MAX_LINES`` lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "posttrain"
MAX_LINES = 520  # "no module over ~500 lines"


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = ("posttrain",) + p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """posttrain modules ``name`` imports anywhere in its body (``from a import b`` counts ``a.b`` when
    that is a module, else ``a``)."""
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    got = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            got.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                got.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in got if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {n: _imports(n, p, set(mods)) for n, p in mods.items()}


def _cycle(graph: dict[str, set[str]], nodes: set[str]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n] & nodes):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state and (c := visit(m)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(nodes):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_cycle_finder_finds_a_planted_cycle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycle(g, set(g)) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}, {"a", "b"}) is None


def test_no_import_cycle():
    g = _graph()
    assert _cycle(g, set(g)) is None


def test_losses_import_no_models_trainers_or_config():
    bad = ("posttrain.models", "posttrain.trainers", "posttrain.config")
    g = _graph()
    found = {
        (n, m)
        for n, s in g.items()
        if n.startswith("posttrain.losses")
        for m in s
        if any(m == b or m.startswith(b + ".") for b in bad)
    }
    assert found == set()


def test_the_lower_layers_import_no_trainer_pipeline_or_command_line():
    """rewards (the reward-model loader included), checkpoint reading, models, data, tasks and tokenizers sit below the
    trainers, the pipeline and the CLI: a checkpoint is loaded through posttrain.checkpoints, never a trainer."""
    low = ("posttrain.rewards", "posttrain.checkpoints", "posttrain.models", "posttrain.data", "posttrain.tasks")
    low += ("posttrain.tokenizers", "posttrain.ops", "posttrain.engines")
    high = ("posttrain.trainers", "posttrain.pipeline", "posttrain.cli", "posttrain.labs")
    g = _graph()
    found = {
        (n, m)
        for n, s in g.items()
        if any(n == p or n.startswith(p + ".") for p in low)
        for m in s
        if any(m == b or m.startswith(b + ".") for b in high)
    }
    assert found == set()
    assert "posttrain.checkpoints.load" in g["posttrain.rewards.reward_model"]


def test_no_module_over_the_line_limit():
    long = {
        str(p.relative_to(ROOT)): n
        for p in ROOT.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


def test_no_package_attribute_hides_a_submodule():
    import importlib
    import pkgutil

    hidden = []
    for name, path in _modules().items():
        if path.name != "__init__.py" or name.startswith("posttrain.cli"):
            continue
        pkg = importlib.import_module(name)
        for info in pkgutil.iter_modules(pkg.__path__):
            value = vars(pkg).get(info.name)
            if (
                value is not None
                and not hasattr(value, "__path__")
                and getattr(value, "__name__", None) != f"{name}.{info.name}"
            ):
                hidden.append(f"{name}.{info.name}")
    assert hidden == []


def test_checkpoint_reading_names_commands_as_the_trainer_registry_does():
    from posttrain.checkpoints.layout import COMMANDS, command_of
    from posttrain.trainers.engine import registry

    recorded = {e.recorded for e in registry.TRAINERS.values()}
    recorded |= {name for e in registry.TRAINERS.values() for name, _ in e.variants}
    assert set(COMMANDS) == recorded
    for name in recorded | {"unknown"}:
        assert command_of(name) == registry.command_of(name)
