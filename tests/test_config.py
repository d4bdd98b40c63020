import argparse
from dataclasses import dataclass

import pytest

from posttrain.config import add_config_flags, build_config, knob, overrides_from_args
from posttrain.errors import ConfigError, UserError


@dataclass
class Inner:
    width: int = knob(8, "width")
    name: str = knob("a", "name")


@dataclass
class Outer:
    steps: int = knob(10, "steps")
    lr: float = knob(1e-3, "lr")
    flag: bool = knob(False, "flag")
    maybe: int | None = knob(None, "optional")
    inner: Inner = knob(factory=Inner, help="inner")


def test_precedence_defaults_preset_file_flags(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("steps: 30\ninner:\n  width: 16\n")
    cfg = build_config(Outer, preset={"steps": 20, "lr": 0.5}, file=f, overrides={"steps": "40", "inner.name": "z"})
    assert (cfg.steps, cfg.lr, cfg.inner.width, cfg.inner.name) == (40, 0.5, 16, "z")


def test_toml_file(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("steps = 3\n[inner]\nwidth = 4\n")
    cfg = build_config(Outer, file=f)
    assert (cfg.steps, cfg.inner.width) == (3, 4)


@pytest.mark.parametrize(
    "overrides, msg",
    [
        ({"steps": "ten"}, "steps='ten' is not a valid int"),
        ({"flag": "maybe"}, "flag='maybe'"),
        ({"nope": "1"}, "unknown config field nope"),
        ({"inner.bad": "1"}, "unknown config field inner.bad"),
        ({"steps": "1.5"}, "is not a valid int"),
    ],
)
def test_bad_values_name_the_field(overrides, msg):
    with pytest.raises(ConfigError, match=msg):
        build_config(Outer, overrides=overrides)


def test_coercions():
    cfg = build_config(Outer, overrides={"flag": "true", "maybe": "none", "lr": "2e-3"})
    assert cfg.flag is True and cfg.maybe is None and cfg.lr == 2e-3


def test_missing_and_malformed_file(tmp_path):
    with pytest.raises(UserError, match="config file not found"):
        build_config(Outer, file=tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1,\n")
    with pytest.raises(UserError, match="cannot parse config"):
        build_config(Outer, file=bad)


def test_flags_roundtrip():
    p = argparse.ArgumentParser()
    add_config_flags(p, Outer)
    args = p.parse_args(["--steps", "5", "--inner.width", "3", "--maybe", "7"])
    cfg = build_config(Outer, overrides=overrides_from_args(args))
    assert (cfg.steps, cfg.inner.width, cfg.maybe) == (5, 3, 7)


# ---------------------------------------------------------------------------------------------
# validation declared on the knob: finiteness, bounds, choices

import dataclasses
import importlib
import json
import math
import typing

from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.cli import main
from posttrain.config import bounds_text, check_fields, coerce


@dataclass
class Bounded:
    lr: float = knob(1e-3, "lr", gt=0)
    frac: float = knob(0.5, "frac", ge=0, le=1)
    bound: float = knob(1.0, "bound", ge=0, allow_inf=True)
    edges: tuple[float, ...] = knob((1.0, 2.0), "edges")
    threads: int | None = knob(1, "threads", ge=1)
    kw: dict = knob(factory=dict, help="kw")

    def __post_init__(self):
        check_fields(self)


@pytest.mark.parametrize(
    "overrides, msg",
    [
        ({"lr": "inf"}, "lr=inf is not a finite number"),
        ({"lr": "nan"}, "lr=nan is not a finite number"),
        ({"lr": "-Infinity"}, "lr=-inf is not a finite number"),
        ({"lr": "1e999"}, "lr=inf is not a finite number"),
        ({"lr": "0"}, "lr=0.0 must be > 0"),
        ({"frac": "1.5"}, "frac=1.5 must be in [0, 1]"),
        ({"bound": "nan"}, "bound=nan is not a finite number"),
        ({"bound": "-1"}, "bound=-1.0 must be >= 0"),
        ({"edges": "1,nan"}, "edges=nan is not a finite number"),
        ({"threads": "-1"}, "threads=-1 must be >= 1 (or None)"),
        ({"threads": "0"}, "threads=0 must be >= 1 (or None)"),
        ({"kw": '{"a": {"b": NaN}}'}, "kw.a.b=nan is not a finite number"),
        ({"kw": '{"a": [1, Infinity]}'}, "kw.a=inf is not a finite number"),
    ],
)
def test_bounds_and_finiteness_from_flags(overrides, msg):
    with pytest.raises(ConfigError) as e:
        build_config(Bounded, overrides=overrides)
    assert str(e.value) == msg


def test_allow_inf_and_none_pass():
    cfg = build_config(Bounded, overrides={"bound": "inf", "threads": "none", "frac": "1", "lr": "1e-9"})
    assert (cfg.bound, cfg.threads, cfg.frac) == (math.inf, None, 1.0)


def test_python_api_is_checked_like_the_cli():
    for kw, msg in [
        ({"lr": math.inf}, "lr=inf is not a finite number"),
        ({"frac": -0.1}, "frac=-0.1 must be in [0, 1]"),
        ({"threads": -1}, "threads=-1 must be >= 1 (or None)"),
        ({"lr": "big"}, "lr='big' is not a number"),
        ({"kw": {"x": math.nan}}, "kw.x=nan is not a finite number"),
    ]:
        with pytest.raises(ConfigError) as e:
            Bounded(**kw)
        assert str(e.value) == msg


def test_bounds_reach_the_help_text():
    p = argparse.ArgumentParser()
    add_config_flags(p, Bounded)
    text = p.format_help()
    assert "lr [> 0]" in text and "frac [in [0, 1]]" in text and "threads [>= 1]" in text
    assert [bounds_text(b) for b in ({"gt": 0, "lt": 1}, {"le": 2.5}, {"lt": 2**32})] == [
        "in (0, 1)",
        "<= 2.5",
        "< 4294967296",
    ]


# every config dataclass the commands build: each float refuses NaN (and inf unless allowed), each bound is enforced
CONFIG_MODULES = (
    "posttrain.trainers.sft_config",
    "posttrain.trainers.dpo_config",
    "posttrain.trainers.reward_config",
    "posttrain.trainers.pg_config",
    "posttrain.trainers.ppo_config",
    "posttrain.trainers.alarms",
    "posttrain.generate",
    "posttrain.models.gpt",
    "posttrain.tasks.embedded",
    "posttrain.data.preference_pairs",
    "posttrain.data.dedup.run",
)


def _config_classes():
    out = []
    for name in CONFIG_MODULES:
        mod = importlib.import_module(name)
        for obj in vars(mod).values():
            if (
                isinstance(obj, type)
                and dataclasses.is_dataclass(obj)
                and obj.__module__ == name
                and any("help" in f.metadata for f in dataclasses.fields(obj))
            ):
                out.append(obj)
    return out


CONFIG_CLASSES = _config_classes()


def _is_float(tp) -> bool:
    return tp is float or (
        typing.get_origin(tp) in (typing.Union, __import__("types").UnionType) and float in typing.get_args(tp)
    )


def _outside(b: dict, is_int: bool):
    """A value violating bounds ``b``: the exclusive bound itself, or one step past an inclusive one."""
    step = 1 if is_int else 0.5
    if "gt" in b:
        return b["gt"]
    if "ge" in b:
        return b["ge"] - step
    if "lt" in b:
        return b["lt"]
    return b["le"] + step


def test_every_command_config_is_found():
    names = {c.__name__ for c in CONFIG_CLASSES}
    assert {
        "SFTConfig",
        "DPOConfig",
        "RMConfig",
        "PolicyGradientConfig",
        "PPOConfig",
        "AlarmConfig",
        "SamplingConfig",
        "GPTConfig",
        "TaskConfig",
        "PairDataConfig",
        "DedupConfig",
    } <= names


@pytest.mark.parametrize("cls", CONFIG_CLASSES, ids=lambda c: c.__name__)
def test_every_config_field_is_validated(cls):
    base = cls()
    checked = 0
    for f, tp in ((f, typing.get_type_hints(cls)[f.name]) for f in dataclasses.fields(cls)):
        if dataclasses.is_dataclass(tp):
            continue
        if _is_float(tp):
            for bad in (math.nan, math.inf, -math.inf):
                if math.isinf(bad) and f.metadata.get("allow_inf"):  # bounds then reject -inf where needed
                    continue
                with pytest.raises(ConfigError, match=f"{f.name}={bad!r} is not a finite number"):
                    dataclasses.replace(base, **{f.name: bad})
                checked += 1
        if "bounds" in f.metadata:
            v = _outside(f.metadata["bounds"], not _is_float(tp))
            with pytest.raises(ConfigError, match=f"{f.name}={v!r} must be"):
                dataclasses.replace(base, **{f.name: v})
            checked += 1
    assert checked  # every command config has numeric fields to check


# flags a hostile user passes: exit 2, one line naming the field, nothing created
CLI_CASES = [
    (["sft", "--lr", "inf"], "lr=inf is not a finite number"),
    (["sft", "--lr", "nan"], "lr=nan is not a finite number"),
    (["sft", "--weight-decay", "nan"], "weight_decay=nan is not a finite number"),
    (["sft", "--threads", "-1"], "threads=-1 must be >= 1 (or None)"),
    (["sft", "--max-new-tokens", "0"], "max_new_tokens=0 must be > 0"),
    (["sft", "--grad-clip", "nan"], "grad_clip=nan is not a finite number"),
    (["dpo", "--lr", "inf"], "lr=inf is not a finite number"),
    (["dpo", "--beta", "inf"], "beta=inf is not a finite number"),
    (
        ["dpo", "--loss", "cdpo", "--loss-kwargs", '{"label_smoothing": 5}'],
        "loss_kwargs.label_smoothing=5 must be in [0, 0.5] (loss 'cdpo')",
    ),
    (
        ["dpo", "--loss", "robust", "--loss-kwargs", '{"label_smoothing": 0.5}'],
        "loss_kwargs.label_smoothing=0.5 must be in [0, 0.5) (loss 'robust')",
    ),
    (
        ["dpo", "--loss", "cdpo", "--loss-kwargs", '{"label_smoothing": "a"}'],
        "loss_kwargs.label_smoothing='a' is not a number (loss 'cdpo')",
    ),
    (
        ["dpo", "--loss", "cdpo", "--loss-kwargs", '{"label_smoothing": NaN}'],
        "loss_kwargs.label_smoothing=nan is not a finite number",
    ),
    (["rm", "--lr", "inf"], "lr=inf is not a finite number"),
    (["rm", "--center-coef", "nan"], "center_coef=nan is not a finite number"),
    (["grpo", "--temperature", "nan"], "temperature=nan is not a finite number"),
    (["grpo", "--beta", "nan"], "beta=nan is not a finite number"),
    (["grpo", "--lr", "nan"], "lr=nan is not a finite number"),
    (["grpo", "--lr", "inf"], "lr=inf is not a finite number"),
    (["grpo", "--clip-eps-low", "-1"], "clip_eps_low=-1.0 must be in [0, 1]"),
    (["grpo", "--grad-clip", "nan"], "grad_clip=nan is not a finite number"),
    (["grpo", "--alarms.kl-bound", "nan"], "alarms.kl_bound=nan is not a finite number"),
]


@pytest.mark.parametrize("argv, message", CLI_CASES, ids=lambda a: " ".join(a) if isinstance(a, list) else None)
def test_cli_rejects_bad_values_before_anything_runs(argv, message, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*argv, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"posttrain {argv[0]}: error: {message}\n"
    assert not out.exists() and captured.out == ""  # nothing announced, trained or saved


def test_eval_and_dedup_reject_bad_values(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a"}\n')
    assert main(["eval", str(tmp_path / "ckpt"), "--data", str(data), "--temperature", "nan"]) == 2
    assert capsys.readouterr().err == "posttrain eval: error: temperature=nan is not a finite number\n"
    out = tmp_path / "kept.jsonl"
    assert main(["dedup", str(data), "--output", str(out), "--semantic-threshold", "5", "--no-progress"]) == 2
    assert capsys.readouterr().err == "posttrain dedup: error: semantic_threshold=5.0 must be in [-1, 1]\n"
    assert not out.exists()


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.floats().map(repr),
        st.floats().map(str),
        st.text(max_size=12),
        st.sampled_from(["nan", "-nan", "inf", "+Infinity", "1e309", "-1e999", "1_0.5", " 2 ", "0x10"]),
    )
)
def test_coerce_float_is_finite_or_config_error(s):
    try:
        want = float(s)
    except ValueError:
        want = None
    try:
        got = coerce("x", s, float)
    except ConfigError as e:
        assert want is None or not math.isfinite(want)
        assert str(e).startswith("x=") and ("is not a finite number" in str(e) or "is not a valid float" in str(e))
    else:
        assert want is not None and math.isfinite(got) and got == want


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(), max_size=4))
def test_coerce_containers_refuse_non_finite(xs):
    finite = all(math.isfinite(x) for x in xs)
    for value, tp in ((",".join(map(repr, xs)), tuple[float, ...]), (json.dumps({"k": xs}), dict)):
        try:
            got = coerce("x", value, tp)
        except ConfigError as e:
            assert not finite and "is not a finite number" in str(e)
        else:
            assert finite and (list(got) == xs if tp is not dict else got == {"k": xs})


# ---------------------------------------------------------------------------------------------
# config files: errors name file and line


@pytest.mark.parametrize(
    "name, body, msg",
    [
        ("c.yaml", b"steps: 3\nlr: \xff\n", "c.yaml:2: not valid UTF-8 (byte 0xff at column 5)"),
        (
            "c.yaml",
            b"steps: [1,\nlr: 2\n",
            "c.yaml:3: cannot parse config: expected ',' or ']', but got '<stream end>' "
            "(column 1; while parsing a flow sequence started at line 1)",
        ),
        (
            "c.yaml",
            b"steps: 1\n  lr: 2\n",
            "c.yaml:2: cannot parse config: mapping values are not allowed here (column 5)",
        ),
        ("c.toml", b"steps = 3\nlr = = 2\n", "c.toml:2: cannot parse config: Invalid value (column 6)"),
        ("c.toml", b"steps = 3\n\xc3\x28 = 1\n", "c.toml:2: not valid UTF-8 (byte 0xc3 at column 1)"),
        ("c.yaml", b"lr: .nan\n", "lr=nan is not a finite number"),
        ("c.toml", b"lr = inf\n", "lr=inf is not a finite number"),
        ("c.yaml", b"steps: .inf\n", "steps=inf is not a valid int"),
    ],
)
def test_config_file_errors_are_one_line_with_the_line(tmp_path, name, body, msg):
    f = tmp_path / name
    f.write_bytes(body)
    with pytest.raises(UserError) as e:
        build_config(Outer, file=f)
    assert str(e.value) == (f"{tmp_path}/{msg}" if msg.startswith("c.") else msg)


def test_cli_config_file_with_invalid_utf8(tmp_path, capsys):
    f = tmp_path / "c.yaml"
    f.write_bytes(b"# comment\nsteps: 2\nout: r\xe9sultats\n")
    assert main(["sft", "--config", str(f), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == f"posttrain sft: error: {f}:3: not valid UTF-8 (byte 0xe9 at column 7)\n"


def test_help_text_with_a_percent_sign_is_printed_verbatim():
    """argparse %-formats help strings: a field doc saying '10%' crashed every command's --help."""

    @dataclass
    class Pct:
        progress: bool = knob(True, "plain lines every 10% when not a terminal")

    p = argparse.ArgumentParser(prog="x")
    add_config_flags(p, Pct)
    assert "every 10% when" in " ".join(p.format_help().split())


_PRESET_TABLES = [  # (module, config class): each module's PRESETS is what `--preset NAME` accepts
    ("posttrain.trainers.sft_config", "SFTConfig"),
    ("posttrain.trainers.pg_config", "PolicyGradientConfig"),
    ("posttrain.trainers.ppo_config", "PPOConfig"),
    ("posttrain.trainers.dpo_config", "DPOConfig"),
    ("posttrain.trainers.reward_config", "RMConfig"),
    ("posttrain.pipeline.config", "PipelineConfig"),
]


@pytest.mark.parametrize(
    "module,cls,name", [(m, c, n) for m, c in _PRESET_TABLES for n in importlib.import_module(m).PRESETS]
)
def test_every_preset_builds_a_valid_config_that_says_what_it_sets(module, cls, name):
    mod = importlib.import_module(module)
    preset = mod.PRESETS[name]
    cfg = build_config(getattr(mod, cls), preset)  # a misspelt key or an out-of-bounds value raises here

    def check(obj, values, path):
        for k, v in values.items():
            got = obj[k] if isinstance(obj, dict) else getattr(obj, k)
            if isinstance(v, dict):
                check(got, v, f"{path}{k}.")
            else:
                assert got == (tuple(v) if isinstance(got, tuple) else v), f"{name}: {path}{k}"

    check(cfg, preset, "")


def test_sft_tiny_preset_is_the_measured_command():
    # docs/outcomes/2026-12-04_xeon_tiny_*: `sft --steps 2000 --weight-decay 3.0 --restarts 4 --restart-probe 0.5
    # --restart-keep 1` on the field defaults
    from posttrain.trainers.sft_config import PRESETS, SFTConfig

    flags = {"steps": "2000", "weight_decay": "3.0", "restarts": "4", "restart_probe": "0.5", "restart_keep": "1"}
    assert build_config(SFTConfig, PRESETS["tiny"]) == build_config(SFTConfig, overrides=flags)


def test_grpo_tiny_1000_preset_is_the_measured_command():
    # docs/outcomes/2026-12-07_{arithmetic,collatz}_grpo_steps1000_seeds0_4.json: `grpo --lr 0.00015 --steps 1000` on the
    # field defaults, its final model the mean of the weights at steps 800/900/1000
    from posttrain.trainers.pg_config import PRESETS, PolicyGradientConfig
    from posttrain.trainers.weight_average import average_steps

    long = build_config(PolicyGradientConfig, PRESETS["tiny_1000"])
    assert long == build_config(PolicyGradientConfig, overrides={"lr": "0.00015", "steps": "1000"})
    assert long == build_config(PolicyGradientConfig, PRESETS["tiny"], overrides={"steps": "1000"})
    assert average_steps(long.steps, long.average_last, long.average_every) == [800, 900, 1000]


def test_sft_slots16_preset_is_the_measured_command():
    # docs/outcomes/2026-12-04_xeon_slots16_*.json: 16 restarts ranked at step 300 of 600, the best 2 finishing, with
    # digit-slot positions, on the field defaults (600 steps, weight decay 0.1)
    from posttrain.trainers.sft_config import PRESETS, SFTConfig

    flags = {"restarts": "16", "restart_probe": "0.5", "restart_keep": "2", "model.digit_slots": "2"}
    cfg = build_config(SFTConfig, PRESETS["slots16"])
    assert cfg == build_config(SFTConfig, overrides=flags) and (cfg.steps, cfg.weight_decay) == (600, 0.1)
    assert build_config(SFTConfig, PRESETS["single"]) == SFTConfig()  # one plain run: the field defaults


@pytest.mark.parametrize("module", [m for m, _ in _PRESET_TABLES])
def test_every_preset_says_in_one_line_when_to_choose_it(module):
    from posttrain.cli._common import add_preset_flags
    from posttrain.config import Preset

    presets = importlib.import_module(module).PRESETS
    for name, preset in presets.items():
        assert isinstance(preset, Preset) and preset.when.strip() and "\n" not in preset.when, name
    p = argparse.ArgumentParser(prog="x")
    add_preset_flags(p, presets)
    text = "".join(p.format_help().split())  # argparse wraps lines at spaces and after hyphens
    assert all(f"{name}:{''.join(presets[name].when.split())}" in text for name in presets)


@pytest.mark.parametrize(
    "command,removed",
    [("sft", "tiny_v8"), ("sft", "tiny_v5"), ("rm", "tiny_v1"), ("rm", "classic"), ("grpo", "last_weights")],
)
def test_a_removed_preset_name_is_a_one_line_error_naming_the_presets(command, removed, capsys):
    from posttrain.cli import main
    from posttrain.trainers.engine.registry import TRAINERS

    assert main([command, "--preset", removed, "--out", "/nonexistent/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"unknown preset {removed!r}" in err
    assert all(name in err for name in TRAINERS[command].presets())
