"""Short SFT, DPO and reward-model runs end bitwise where they ended when the fingerprints were recorded.

Oracle: the recorded output of the same commands (``fingerprints.json`` beside this file): the sha256 of every
weight file a run writes (``model/``, periodic checkpoints, restarts), its ``metrics.jsonl`` and ``summary.json``
without timing fields, and each checkpoint's ``trainer_state.json`` with the run's own directory and id and its saved
config taken out (a knob added at a default that changes nothing is not a change of the record; a default that does
change training shows in the weights). A refactor of the trainers that changes none of their arithmetic keeps every
one of them.

Weights depend on the torch build and the CPU, so the comparison is made only where the recording was (same
torch and Python, same CPU kind: model and the vector ISA of torch's kernels, since an Intel Xeon and an AMD EPYC
both on AVX-512 round differently); elsewhere the test is skipped with the reason. After a change meant to alter training,
record again: ``.venv/bin/python tests/trainers/test_fingerprints.py --write``.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from pathlib import Path

import pytest
import torch

from posttrain.pipeline.run import cpu_description

HERE = Path(__file__).parent
RECORD = HERE / "fingerprints.json"
TIMING = {"step_time", "mfu", "peak_memory_gb", "peak_memory_kind", "run_id"}  # and *_seconds, *_per_s
COMMON = "--threads 1 --progress false --seed 0"
TASK = "--task.digits 1 --task.num-demos 24 --task.num-eval 8"
TINY = "--model.n-layer 1 --model.d-model 32 --model.n-head 2"
SHORT = "--steps 6 --batch-size 8 --eval-every 3 --save-every 3 --warmup-steps 2"
PAIRS = "--pairs.num-prompts 16 --pairs.samples-per-prompt 4 --pairs.gold-chosen true"


def _jsonl(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _files(d: Path) -> dict[str, str]:
    """The user files the runs train on: {prompt, answer} demonstrations, pairs, and a chat file."""
    demos = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(6) for b in range(5)]
    pairs = [
        {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1 + (a * b) % 3)}
        for a in range(6)
        for b in range(5)
    ]
    words = ["red", "blue", "green", "gold", "grey", "pink", "teal", "navy"]
    chat = [
        {"messages": [{"role": "user", "content": f"colour {i}?"}, {"role": "assistant", "content": w}]}
        for i, w in enumerate(words * 3)
    ]
    return {
        "demos": _jsonl(d / "demos.jsonl", demos),
        "pairs": _jsonl(d / "pairs.jsonl", pairs),
        "chat": _jsonl(d / "chat.jsonl", chat),
    }


def runs(d: Path, hf_model: str | None) -> list[tuple[str, list[str]]]:
    """(name, argv) of every run, in order (later runs start from ``sft``'s model)."""
    f, sft = _files(d), str(d / "sft")
    out = [
        ("sft", f"sft --preset single {TINY} {TASK} {SHORT}"),
        (
            "sft_restarts",
            f"sft --preset single --restarts 2 --restart-probe 0.5 --val-problems 16 {TINY} {TASK} {SHORT}",
        ),
        (
            "sft_val",
            f"sft --preset single --val-fraction 0.3 --val-problems 16 --patience 3 {TINY} {TASK} {SHORT} "
            "--eval-every 1",
        ),
        ("sft_demos", f"sft --init {sft} --data {f['demos']} --grad-accum 2 {SHORT}"),
        ("dpo", f"dpo --init {sft} {PAIRS} {TASK} {SHORT}"),
        ("dpo_kto", f"dpo --init {sft} --loss kto {PAIRS} {TASK} {SHORT}"),
        ("dpo_beta", f"dpo --init {sft} --loss beta_dpo {PAIRS} {TASK} {SHORT}"),
        ("dpo_data", f"dpo --init {sft} --data {f['pairs']} {SHORT}"),
        (  # the field defaults (what `--preset classic` was): the tiny recipe's other fields set back
            "rm",
            f"rm --preset tiny --sft-coef 0 --pairs.max-pairs-per-prompt 2 --train-pairs.samples-per-prompt none {TINY} "
            f"{TASK} {SHORT} --eval-prompts 8 {PAIRS}",
        ),
        (
            "rm_policy",
            f"rm --init {sft} --batch-by prompt --eval-prompts 8 --train-pairs.restarts off {TASK} {SHORT} {PAIRS}",
        ),
        ("rm_data", f"rm --init {sft} --data {f['pairs']} --sft-coef 0.5 {SHORT}"),
    ]
    if hf_model is not None:  # a user's Hugging Face model on a chat file
        out.append(("sft_chat", f"sft --model {hf_model} --data {f['chat']} --max-new-tokens 2 {SHORT}"))
    return [(name, [*argv.split(), *COMMON.split(), "--out", str(d / name)]) for name, argv in out]


def _timing(key: str) -> bool:
    return key in TIMING or key.endswith(("_seconds", "_per_s"))


def _clean(x, root: str):
    if isinstance(x, dict):
        return {k: _clean(v, root) for k, v in x.items() if not _timing(k)}
    if isinstance(x, list):
        return [_clean(v, root) for v in x]
    return x.replace(root, "<TMP>") if isinstance(x, str) else x


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fingerprint(run: Path, root: str) -> dict[str, str]:
    """{relative path: sha256} of a run's weights, and of its metrics, cached pairs, summary and trainer states
    (cleaned)."""
    out = {}
    for p in sorted(run.rglob("*")):
        rel = str(p.relative_to(run))
        if p.suffix == ".safetensors" or p.name == "reward_stats.json":
            out[rel] = _sha(p.read_bytes())
        elif p.name in ("summary.json", "trainer_state.json"):
            state = json.loads(p.read_text())
            if p.name == "trainer_state.json":
                state.pop("config", None)  # a new knob, a no-op at its default, changes no result
            out[rel] = _sha(json.dumps(_clean(state, root), sort_keys=True).encode())
        elif p.suffix == ".jsonl":  # metrics.jsonl; pairs.jsonl and eval_pairs.jsonl: the cached pairs
            rows = [_clean(json.loads(ln), root) for ln in p.read_text().splitlines()]
            out[rel] = _sha(json.dumps(rows, sort_keys=True).encode())
    return out


def environment() -> dict[str, str]:
    """What decides the rounding: torch's build, Python, and the CPU kind with its kernels' vector ISA."""
    return {
        "torch": torch.__version__,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu": cpu_description(),
    }


def collect(d: Path) -> dict[str, dict[str, str]]:
    from posttrain.cli import main

    hf_model = None
    try:
        import transformers  # noqa: F401

        sys.path.insert(0, str(HERE.parent / "models"))
        from _hfdirs import make_model_dir

        hf_model = str(make_model_dir(d / "hf_qwen2", "qwen2"))
    except ImportError:
        pass
    got = {}
    for name, argv in runs(d, hf_model):
        assert main(argv) == 0, name
        got[name] = fingerprint(d / name, str(d))
    return got


def test_short_runs_end_bitwise_as_recorded(tmp_path):
    if not RECORD.is_file():
        pytest.skip(f"no recorded fingerprints ({RECORD.name})")
    record = json.loads(RECORD.read_text())
    if record["environment"] != environment():
        pytest.skip(f"fingerprints recorded under {record['environment']}, this is {environment()}")
    got = collect(tmp_path)
    want = record["runs"]
    for name in want:
        if name not in got:  # sft_chat needs transformers
            continue
        diff = sorted(k for k in set(want[name]) | set(got[name]) if want[name].get(k) != got[name].get(k))
        assert not diff, f"{name}: {diff}"


if __name__ == "__main__":  # record: python tests/trainers/test_fingerprints.py --write [DIR]
    import tempfile

    assert sys.argv[1:2] == ["--write"], __doc__
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        RECORD.write_text(json.dumps({"environment": environment(), "runs": collect(d)}, indent=1) + "\n")
    print(f"wrote {RECORD}")
