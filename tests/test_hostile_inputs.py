"""Hostile inputs at the CLI and the shared loaders: divergence (a model that is finite but overflows), corrupt files,
a tokenizer too big for its model, huge records, runaway chat templates and dangling symlinks. Each ends in one
line on stderr and exit 2 (or the right result), with nothing of value lost.
"""

import argparse
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from posttrain.cli import main
from posttrain.errors import DataError, NonFiniteError, UserError

TASK = ["--task.digits", "1", "--task.num-demos", "8", "--task.num-eval", "4"]
MODEL = ["--model.n-layer", "1", "--model.d-model", "32", "--model.n-head", "2"]
SFT = ["--restarts", "1", "--batch-size", "8", "--eval-every", "0", "--progress", "false", *MODEL, *TASK]
RL = ["--prompts-per-step", "2", "--num-generations", "2", "--max-new-tokens", "4", "--eval-every", "0"]
RL += ["--progress", "false", *TASK]


def _one_line(capsys, *needles: str) -> str:
    """The single error line a failed command printed (no traceback), checked to contain each of ``needles``."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ": error: " in ln]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _logits_finite(ckpt_dir: Path) -> bool:
    from posttrain.checkpoints.load import load_checkpoint

    ck = load_checkpoint(ckpt_dir)
    with torch.no_grad():
        return bool(torch.isfinite(ck.model(input_ids=torch.arange(8)[None] % 10).logits).all())


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    """A small SFT run (2 steps) whose model/ the tests start from or copy."""
    out = tmp_path_factory.mktemp("sft") / "run"
    assert main(["sft", "--out", str(out), "--steps", "2", "--save-every", "0", *SFT]) == 0
    return out


def _blow_up(model_dir: Path, factor: float = 1e28) -> None:
    """Scale every weight by ``factor``: all finite, but the forward pass overflows (what lr=1e30 leaves behind)."""
    w = model_dir / "model.safetensors"
    save_file({k: v * factor for k, v in load_file(str(w)).items()}, str(w))


# ------------------------------------------------------------------ 6. divergence


def test_sft_at_lr_1e30_saves_no_model_and_names_the_step(tmp_path, capsys):
    """One step at lr=1e30 leaves finite weights near 1e28 whose forward is NaN: the step-1 checkpoint is refused
    (naming the step), and so is the final model (by the save, or earlier by the sampler of the final evaluation)."""
    out = tmp_path / "run"
    assert main(["sft", "--out", str(out), "--steps", "2", "--lr", "1e30", "--save-every", "1", *SFT]) == 2
    _one_line(capsys, "refusing to save", "step-00000001", "at step 1", "NaN/Inf")
    assert not (out / "model").exists() and not list(out.glob("checkpoints/step-*"))
    assert main(["sft", "--out", str(tmp_path / "b"), "--steps", "2", "--lr", "1e30", "--save-every", "0", *SFT]) == 2
    _one_line(capsys, "NaN/Inf")
    assert not (tmp_path / "b" / "model").exists()


def test_a_finite_but_overflowing_model_is_refused_and_the_good_checkpoint_kept(sft, tmp_path):
    """The oracle: the parameters are all finite (checked), the forward is not, and the directory's bytes stay."""
    from posttrain.checkpoints.load import load_checkpoint
    from posttrain.trainers.checkpoint import save_checkpoint

    good = tmp_path / "ck"
    ck = load_checkpoint(sft / "model")
    save_checkpoint(good, ck.model, ck.tokenizer, {"step": 1})
    before = {f.name: f.read_bytes() for f in good.iterdir()}
    with torch.no_grad():
        for p in ck.model.parameters():
            p.mul_(1e28)
    assert all(bool(torch.isfinite(p).all()) for p in ck.model.parameters())
    with pytest.raises(NonFiniteError, match=r"forward pass gives NaN/Inf logits at step 7"):
        save_checkpoint(good, ck.model, ck.tokenizer, {"step": 7})
    assert {f.name: f.read_bytes() for f in good.iterdir()} == before
    assert _logits_finite(good)


def test_dpo_at_lr_1e30_writes_no_model(sft, tmp_path, capsys):
    out = tmp_path / "dpo"
    args = ["dpo", "--preset", "tiny", "--init", str(sft), "--out", str(out), "--steps", "3", "--lr", "1e30"]
    args += ["--batch-size", "4", "--eval-every", "0", "--save-every", "0", "--progress", "false", *TASK]
    args += ["--pairs.num-prompts", "16", "--pairs.samples-per-prompt", "4", "--pairs.gold-chosen", "true"]
    assert main(args) == 2
    _one_line(capsys, "NaN/Inf")
    assert not (out / "model").exists()


def test_grpo_at_lr_1e30_is_one_line_not_an_index_error(sft, tmp_path, capsys):
    """A reward that varies (the completion's length) so the update is not zero: the policy diverges, and the
    sampler (or a save) refuses with one line instead of an index error."""
    reward = tmp_path / "length.py"
    reward.write_text("def length(prompts, completions, **kw):\n    return [float(len(c)) for c in completions]\n")
    out = tmp_path / "grpo"
    args = ["grpo", "--init", str(sft), "--out", str(out), "--steps", "6", "--lr", "1e30", "--save-every", "0"]
    assert main([*args, "--reward", f"{reward}:length", *RL]) == 2
    _one_line(capsys, "NaN/Inf")
    assert not (out / "model").exists()


@pytest.mark.parametrize("bad", ["nan", "inf", "all_neg_inf"])
def test_the_sampler_refuses_non_finite_logits_naming_the_step(bad):
    from posttrain.generate import SamplingConfig, generate

    class Fixed(torch.nn.Module):
        """Logits (B, T, 5): row 1 bad from the start, row 0 fine."""

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, **_):
            logits = torch.zeros(*input_ids.shape, 5)
            logits[1] = {"nan": float("nan"), "inf": float("inf"), "all_neg_inf": float("-inf")}[bad]
            return argparse.Namespace(logits=logits, past_key_values=None)

    with pytest.raises(NonFiniteError, match=r"^sampling at step 7: the next-token logits of row 1 are NaN/Inf"):
        generate(
            Fixed(), [[1, 2], [3]], pad_id=0, eos_id=None, cfg=SamplingConfig(max_new_tokens=2), use_cache=False, step=7
        )


def test_the_sampler_still_samples_a_finite_model_with_masked_tokens():
    """-inf on some tokens (not a whole row) is a legitimate mask: sampling goes on and never picks them."""
    from posttrain.generate import SamplingConfig, generate

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, **_):
            logits = torch.zeros(*input_ids.shape, 5)
            logits[..., :3] = float("-inf")
            return argparse.Namespace(logits=logits, past_key_values=None)

    g = generate(Masked(), [[1], [2]], pad_id=0, eos_id=None, cfg=SamplingConfig(max_new_tokens=6), use_cache=False)
    assert set(g.completion_ids.flatten().tolist()) <= {3, 4}


@pytest.mark.parametrize("how", ["overflowing", "nan"])
def test_eval_and_export_refuse_a_non_finite_model(sft, tmp_path, capsys, how):
    bad = tmp_path / "bad"
    shutil.copytree(sft / "model", bad)
    if how == "nan":
        w = bad / "model.safetensors"
        sd = load_file(str(w))
        sd["blocks.0.attn.proj.weight"][0, 0] = float("nan")
        save_file(sd, str(w))
    else:
        _blow_up(bad)
    assert main(["eval", str(bad)]) == 2
    _one_line(capsys, "refusing to evaluate", str(bad))
    assert main(["export", str(bad), "--out", str(tmp_path / "hf")]) == 2
    _one_line(capsys, "refusing to export", str(bad))
    assert not (tmp_path / "hf").exists()


# ------------------------------------------------------------------ 8. corrupt files


@pytest.fixture(scope="module")
def ppo_run(sft, tmp_path_factory):
    out = tmp_path_factory.mktemp("ppo") / "run"
    args = ["ppo", "--init", str(sft), "--out", str(out), "--steps", "1", "--save-every", "0", "--mu", "1"]
    assert main([*args, "--minibatches", "1", *RL]) == 0
    return out


def _pickled_object(path: Path) -> None:
    torch.save({"state": {}, "param_groups": [], "x": argparse.Namespace(a=1)}, path)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    "name, damage",
    [("critic_optimizer.pt", _pickled_object), ("critic_optimizer.pt", _truncate), ("critic.safetensors", _truncate)],
)
def test_ppo_resume_with_a_corrupt_critic_file_names_it(ppo_run, tmp_path, capsys, name, damage):
    run = tmp_path / "run"
    shutil.copytree(ppo_run, run)
    damage(run / "model" / name)
    assert main(["ppo", "--resume", str(run), "--steps", "2"]) == 2
    line = _one_line(capsys, str(run / "model" / name))
    assert "weights_only" not in line and "SafetensorError" not in line


def test_sft_resume_with_a_truncated_best_weights_file_names_it(tmp_path, capsys):
    """Validation selection keeps the best-so-far weights in each checkpoint (best.safetensors)."""
    run = tmp_path / "run"
    args = [
        "sft",
        "--out",
        str(run),
        "--steps",
        "2",
        "--val-fraction",
        "0.25",
        "--eval-every",
        "1",
        "--save-every",
        "1",
    ]
    assert main([*args, *SFT[:4], *SFT[6:8], *MODEL, "--task.digits", "1", "--task.num-demos", "16"]) == 0
    best = run / "checkpoints" / "step-00000001" / "best.safetensors"
    _truncate(best)
    shutil.rmtree(run / "model")  # so that --resume continues from the damaged checkpoint
    capsys.readouterr()
    assert main(["sft", "--resume", str(run), "--steps", "3"]) == 2
    _one_line(capsys, str(best), "corrupt or unreadable")


@pytest.fixture(scope="module")
def restarts(tmp_path_factory):
    out = tmp_path_factory.mktemp("restarts") / "run"
    args = [
        "sft",
        "--out",
        str(out),
        "--steps",
        "4",
        "--restarts",
        "2",
        "--restart-probe",
        "0.5",
        "--val-problems",
        "8",
    ]
    assert main([*args, *SFT[2:]]) == 0
    return out


@pytest.mark.parametrize(
    "rel, text, reason",
    [
        ("restarts/1/probe.json", '{"step": ', "not valid JSON"),
        ("restarts/1/probe.json", '{"step": 2, "val_accuracy": "x", "val_n": 8, "train_seconds": 1}', "'val_accuracy'"),
        ("restarts/0/summary.json", "[1]", "expected a JSON object"),
        ("restarts/0/summary.json", "{}", "'heldout_accuracy' is absent"),
        ("restarts/0/summary.json", "", "empty"),
    ],
)
def test_sft_restarts_resume_with_a_corrupt_json_names_the_file(restarts, tmp_path, capsys, rel, text, reason):
    run = tmp_path / "run"
    shutil.copytree(restarts, run)
    (run / rel).write_text(text)
    assert main(["sft", "--resume", str(run)]) == 2
    _one_line(capsys, str(run / rel), reason)


def test_dpo_restart_pairs_read_a_corrupt_probe_or_summary_safely(restarts, tmp_path):
    """``dpo/rm --train-pairs.restarts`` read the restarts run: a corrupt probe.json is one line naming it; a
    malformed summary.json is ignored like a missing one (every restart is a source)."""
    from posttrain.on_policy_pairs import restart_models

    run = tmp_path / "run"
    shutil.copytree(restarts, run)
    (run / "summary.json").unlink()
    want = [p.relative_to(run) for p in restart_models(run)]  # no summary: every restart, the kept one too
    assert len(want) == 2
    (run / "summary.json").write_text('{"candidates": [5, {"restart": "x"}, {"restart": 1, "probe": 3}]}')
    assert [p.relative_to(run) for p in restart_models(run)] == want
    (run / "restarts" / "1" / "probe.json").write_text("[1]")
    with pytest.raises(UserError, match=r"restarts/1/probe.json: corrupt probe record"):
        restart_models(run)


@pytest.mark.parametrize(
    "summary, reason",
    [
        ({"stages": 5}, "'stages' is 5, expected an object"),
        ({"heldout": {"sft": 3}}, "heldout.sft is 3"),
        ({"stages": {"sft": {"metrics": [1]}}}, "stages.sft.metrics is [1]"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_report_on_a_malformed_summary_names_the_file(tmp_path, capsys, summary, reason):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "summary.json").write_text(json.dumps(summary))
    (b / "summary.json").write_text(json.dumps({"stages": {}, "heldout": {}}))
    assert main(["report", str(b), str(a)]) == 2
    _one_line(capsys, str(a / "summary.json"), reason)


def test_report_compares_well_formed_summaries(tmp_path, capsys):
    for name, acc in (("a", 0.25), ("b", 0.5)):
        (tmp_path / name).mkdir()
        summary = {"heldout": {"sft": {"greedy": acc}}, "stages": {"sft": {"wall_s": 1.0, "metrics": {}}}}
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "+0.250" in capsys.readouterr().out


def test_a_tokenizer_bigger_than_the_model_is_refused_at_load(sft, tmp_path, capsys):
    big = tmp_path / "big"
    shutil.copytree(sft / "model", big)
    spec = json.loads((big / "tokenizer.json").read_text())
    spec["alphabet"] += "abcdefghij"  # 10 more ids than the model's embedding rows
    (big / "tokenizer.json").write_text(json.dumps(spec))
    rows = json.loads((big / "config.json").read_text())["config"]["vocab_size"]
    data = tmp_path / "e.jsonl"
    data.write_text('{"prompt": "a+b=", "answer": "3"}\n')
    assert main(["eval", str(big), "--data", str(data)]) == 2
    _one_line(capsys, str(big), f"vocabulary has {rows} rows")
    assert main(["grpo", "--init", str(big), "--out", str(tmp_path / "g"), "--steps", "1", *RL]) == 2
    _one_line(capsys, str(big), f"vocabulary has {rows} rows")
    assert not (tmp_path / "g").exists()


# ------------------------------------------------------------------ 9. smaller


def test_eval_long_truncate_prints_short_examples_of_a_huge_record(sft, tmp_path, capsys):
    data = tmp_path / "big.jsonl"
    prompt = "1" * 2_000_000 + "+2="
    data.write_text(json.dumps({"prompt": prompt, "answer": "3"}) + "\n" + '{"prompt": "1+2=", "answer": "3"}\n')
    assert main(["eval", str(sft), "--data", str(data), "--long", "truncate", "--max-new-tokens", "2"]) == 0
    out = capsys.readouterr().out
    assert "(0/2)" in out or "(1/2)" in out or "(2/2)" in out  # both records evaluated
    assert len(out) < 5_000, len(out)


def test_the_trainers_sample_lines_are_short_for_huge_records():
    from posttrain.evaluation import SHOW_CHARS, sample_line

    big = {"prompt": "7" * 10**6, "completion": "\x1b" * 10**6, "answer": "9" * 10**6, "correct": False}
    line = sample_line(big)
    assert len(line) <= 3 * (4 * SHOW_CHARS + 3) + 20  # each field cut, escapes (\\x1b) at most 4 characters each
    assert line.startswith("  " + "7" * SHOW_CHARS + "...") and "\x1b" not in line


def test_a_nested_range_template_fails_within_its_budget():
    from posttrain.chat import RANGE_ITEMS, JinjaTemplate

    nested = "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}"
    with pytest.raises(DataError, match=f"exceeded its rendering budget.*more than {RANGE_ITEMS:,} items"):
        JinjaTemplate(nested, "evil").render([{"role": "user", "content": "hi"}])


def test_a_template_whose_output_explodes_fails_on_its_size():
    from posttrain.chat import JinjaTemplate

    loud = "{% for i in range(100000) %}{{ messages[0].content }}{% endfor %}"
    with pytest.raises(DataError, match="exceeded its rendering budget.*characters"):
        JinjaTemplate(loud, "loud").render([{"role": "user", "content": "x" * 100}])


def test_a_template_under_budget_renders_as_transformers_does():
    """The oracle: transformers' own renderer, on a template using range() and loops; range works outside too."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from posttrain.chat import JinjaTemplate

    src = (
        "{% for m in messages %}{% for i in range(loop.index) %}>{% endfor %}{{ m.role }}: {{ m.content }}\n"
        "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
    )
    msgs = [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"}]
    ours = JinjaTemplate(src, "t").render(msgs, add_generation_prompt=True)
    theirs = render_jinja_template([msgs], chat_template=src, add_generation_prompt=True)[0][0]
    assert ours == theirs == ">user: 1+2=\n>>assistant: 3\nassistant:"


def test_writing_through_a_dangling_symlink_creates_no_directories(tmp_path, capsys):
    from posttrain.data.io import atomic_dir, atomic_write_text

    link = tmp_path / "out.jsonl"
    link.symlink_to(tmp_path / "gone" / "deep" / "out.jsonl")
    with pytest.raises(UserError, match="symbolic link .* whose directory does not exist"):
        atomic_write_text(link, "x")
    dlink = tmp_path / "ckpt"
    dlink.symlink_to(tmp_path / "gone2" / "ckpt")
    with pytest.raises(UserError, match="symbolic link"):
        with atomic_dir(dlink):
            pass
    data = tmp_path / "in.jsonl"
    data.write_text('{"text": "a b c"}\n')
    assert main(["dedup", "--output", str(link), str(data)]) == 2
    _one_line(capsys, str(link), "does not exist")
    assert not (tmp_path / "gone").exists() and not (tmp_path / "gone2").exists()


def test_writing_through_a_symlink_into_an_existing_directory_still_works(tmp_path):
    from posttrain.data.io import atomic_write_text

    (tmp_path / "real").mkdir()
    link = tmp_path / "out.txt"
    link.symlink_to(tmp_path / "real" / "out.txt")
    atomic_write_text(link, "hello")
    assert link.is_symlink() and (tmp_path / "real" / "out.txt").read_text() == "hello"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP saving without a process group: intended
@pytest.mark.parametrize("damage", ["trainer_state.json", "config.json", "overflowing"])
def test_a_damaged_or_diverged_sharded_checkpoint_is_not_exported(tmp_path, capsys, damage):
    from posttrain.models.gpt import GPT, GPTConfig
    from posttrain.tokenizers.char import CharTokenizer
    from posttrain.trainers.distributed import World
    from posttrain.trainers.sharded import save_sharded_checkpoint

    tok = CharTokenizer("0123456789+=")
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, d_model=16, max_seq_len=16))
    if damage == "overflowing":
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1e28)
    opt = torch.optim.AdamW(model.parameters())
    step = save_sharded_checkpoint(tmp_path / "step-2", model, opt, tok, {"step": 2, "trainer": "sft"}, None, World())
    if damage != "overflowing":
        (step / damage).write_text('{"step": ')
    assert main(["export", str(step), "--out", str(tmp_path / "out")]) == 2
    if damage == "overflowing":
        _one_line(capsys, "refusing to save", "NaN/Inf logits at step 2")
    else:
        _one_line(capsys, str(step / damage), "not valid JSON")
    assert not (tmp_path / "out").exists()
