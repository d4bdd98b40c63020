"""``posttrain dedup``'s flags are generated from DedupConfig: every field has one, and every flag the docs
show (docs/dedup.md's usage block, README's) parses to the field it names."""

import re
from dataclasses import fields
from pathlib import Path

import pytest

from posttrain.cli import build_parser
from posttrain.config import build_config, overrides_from_args
from posttrain.data.dedup.run import DedupConfig

ROOT = Path(__file__).resolve().parents[1]
PATHS = {"--output", "-o", "--clusters", "--stats", "-h", "--help"}  # written by hand: not config fields


def _parse(*flags):
    args = build_parser(["dedup"]).parse_args(["dedup", "in.jsonl", "--output", "out.jsonl", *flags])
    return args, build_config(DedupConfig, overrides=overrides_from_args(args))


def _dedup_parser():
    sub = next(a for a in build_parser(["dedup"])._actions if isinstance(a.choices, dict))
    return sub.choices["dedup"]


def test_every_field_has_a_flag_and_every_flag_a_field():
    opts = {o for a in _dedup_parser()._actions for o in a.option_strings}
    want = {"--" + f.name.replace("_", "-") for f in fields(DedupConfig)}
    assert want <= opts
    assert {o for o in opts if not o.startswith("--no-")} - PATHS - want - {
        "--" + f.name for f in fields(DedupConfig)
    } == set()


def test_documented_flags_exist():
    docs = (ROOT / "docs" / "dedup.md").read_text()
    block = docs[docs.index("posttrain dedup INPUT") :]
    block = block[: block.index("```")]  # the usage block
    examples = [
        ln for t in (docs, (ROOT / "README.md").read_text()) for ln in t.splitlines() if "posttrain dedup " in ln
    ]
    documented = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", block + "\n".join(examples)))
    opts = {o for a in _dedup_parser()._actions for o in a.option_strings}
    assert documented and documented <= opts


def test_switches_lists_and_values_reach_the_config():
    _, cfg = _parse(
        "--bloom",
        "--method",
        "exact",
        "--no-progress",
        "--drop-contaminated",
        "--contamination",
        "a.jsonl",
        "b.jsonl",
        "--num-perm",
        "64",
        "--bands",
        "8",
        "--rows",
        "8",
        "--max-bucket",
        "7",
        "--id-field",
        "id",
    )
    assert (cfg.bloom, cfg.progress, cfg.drop_contaminated) == (True, False, True)
    assert cfg.contamination == ("a.jsonl", "b.jsonl") and cfg.method == "exact" and cfg.id_field == "id"
    assert (cfg.num_perm, cfg.bands, cfg.rows, cfg.max_bucket) == (64, 8, 8, 7)
    _, default = _parse()
    assert default == DedupConfig()


def test_bad_values_are_one_line_errors(tmp_path, capsys):
    from posttrain.cli import main

    data = tmp_path / "c.jsonl"
    data.write_text('{"text": "a"}\n')
    for bad, field in ((["--threshold", "abc"], "threshold"), (["--method", "nope"], "method")):
        assert main(["dedup", str(data), "--output", str(tmp_path / "o.jsonl"), "--no-progress", *bad]) == 2
        err = capsys.readouterr().err
        assert field in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flag", ["--bloom", "--progress"])
def test_switch_pairs(flag):
    name = flag[2:]
    assert getattr(_parse(flag)[1], name) is True
    assert getattr(_parse("--no-" + name)[1], name) is False
