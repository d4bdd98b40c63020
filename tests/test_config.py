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
    [({"steps": "ten"}, "steps='ten' is not a valid int"), ({"flag": "maybe"}, "flag='maybe'"),
     ({"nope": "1"}, "unknown config field nope"), ({"inner.bad": "1"}, "unknown config field inner.bad"),
     ({"steps": "1.5"}, "is not a valid int")],
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
