"""Best-of-N evaluation (posttrain/evaluation.py::best_of_n_evaluate) against oracles, and its CLI."""

import json

import pytest
import torch

from posttrain.cli import main
from posttrain.evaluation import best_of_n_evaluate, evaluate
from posttrain.models.gpt import GPTConfig
from posttrain.models.heads import best_of_n, weighted_best_of_n
from posttrain.rewards.verifiers import exact_match_reward
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask

TASK = ArithmeticTask(ArithmeticConfig(digits=1, num_demos=20, num_eval=8))
PROMPTS = [p.prompt for p in TASK.train_problems[:24]]
ANSWERS = [p.answer for p in TASK.train_problems[:24]]


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    from posttrain.trainers.sft import SFTConfig, train_sft

    out = tmp_path_factory.mktemp("sft")  # a briefly trained policy: right on some samples, wrong on others
    train_sft(
        SFTConfig(
            out=str(out),
            steps=30,
            batch_size=16,
            eval_every=0,
            save_every=0,
            progress=False,
            task=TASK.cfg,
            model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24),
        )
    )
    return out


@pytest.fixture(scope="module")
def policy(sft_dir):
    from posttrain.checkpoints.load import load_checkpoint

    ck = load_checkpoint(sft_dir)
    return ck.model.eval(), ck.tokenizer


def run(policy, scorer, n, seed=0, **kw):
    model, tok = policy
    return best_of_n_evaluate(
        model,
        tok,
        PROMPTS,
        ANSWERS,
        scorer=scorer,
        num_samples=n,
        max_new_tokens=2,
        generator=torch.Generator().manual_seed(seed),
        batch_size=10,
        **kw,
    )


def test_oracle_scorer_reaches_pass_at_n(policy):
    r = run(policy, exact_match_reward, 16)
    assert r.pass_at_n > 0  # the check below is not vacuous: some prompt has a correct sample
    assert r.best_of_n_accuracy == r.pass_at_n
    # the anti-oracle (prefers wrong answers) is right only where all N samples are
    anti = run(policy, lambda p, c, answer: [-v for v in exact_match_reward(p, c, answer=answer)], 16)
    assert anti.pass_at_n == r.pass_at_n and anti.best_of_n_accuracy <= r.sample_accuracy <= r.pass_at_n


def test_n1_is_sampled_accuracy(policy):
    model, tok = policy
    r = run(policy, lambda p, c, **_: [0.0] * len(c), 1, seed=3, keep_samples=len(PROMPTS))
    plain = evaluate(
        model,
        tok,
        PROMPTS,
        ANSWERS,
        max_new_tokens=2,
        temperature=1.0,
        batch_size=10,
        generator=torch.Generator().manual_seed(3),
        keep_samples=len(PROMPTS),
    )
    assert [s["completion"] for s in r.samples] == [s["completion"] for s in plain.samples]  # the same samples
    assert len({s["completion"] for s in r.samples}) > 1  # (sampled, not all alike)
    assert r.best_of_n_accuracy == r.pass_at_n == r.sample_accuracy == plain.accuracy


def test_picks_the_highest_score_first_on_ties(policy):
    # a scorer preferring longer completions, then the first: recompute the pick by brute force
    seen = {}

    def scorer(prompts, completions, **_):
        seen["c"] = list(completions)
        return [float(len(c)) for c in completions]

    r = run(policy, scorer, 4, keep_samples=len(PROMPTS))
    # every prompt fits one batch of 10 prompts x 4: the last batch's completions are in seen; check its picks
    last = seen["c"]
    picks = [max(range(4), key=lambda j: (len(last[4 * i + j]), -j)) for i in range(len(last) // 4)]
    assert [s["completion"] for s in r.samples[-len(picks) :]] == [last[4 * i + j] for i, j in enumerate(picks)]


def test_weighted_rule_picks_by_answer(policy):
    # a scorer that puts a lone answer first: "max" takes it, "weighted" takes the answer the rest share
    seen = {}

    def scorer(prompts, completions, **_):
        seen["c"] = list(completions)
        return [float(len(c.strip())) for c in completions]

    for rule in ("max", "weighted"):
        r = run(policy, scorer, 4, keep_samples=len(PROMPTS), rule=rule)
        assert r.rule == rule == r.summary()["rule"]
        last = seen["c"]
        k = len(last) // 4
        scores = torch.tensor([float(len(c.strip())) for c in last])
        if rule == "max":
            want = best_of_n(scores, 4)[0].tolist()
        else:
            want = weighted_best_of_n(scores, [c.strip() for c in last], 4).tolist()
        assert [s["completion"] for s in r.samples[-k:]] == [last[i] for i in want]
    with pytest.raises(ValueError, match="rule must be one of"):
        run(policy, scorer, 2, rule="vote")


def test_bad_scorer_is_a_user_error(policy):
    from posttrain.errors import UserError

    with pytest.raises(UserError, match="best-of-N scorer returned"):
        run(policy, lambda p, c, **_: [float("nan")] * len(c), 2)


def test_eval_cli_best_of_n(sft_dir, tmp_path, capsys):
    from posttrain.trainers.reward import RMConfig, train_reward_model

    rm = tmp_path / "rm"
    train_reward_model(
        RMConfig(
            out=str(rm),
            steps=2,
            batch_size=8,
            eval_every=0,
            save_every=0,
            progress=False,
            eval_prompts=8,
            stats_pairs=16,
            task=TASK.cfg,
            model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24),
        )
    )
    capsys.readouterr()
    out = tmp_path / "ev"
    # no --data: the embedded task's held-out problems, as the checkpoint was configured (digits=1, num_eval=8)
    assert (
        main(
            [
                "eval",
                str(sft_dir),
                "--best-of",
                "4",
                "--reward-model",
                str(rm),
                "--max-new-tokens",
                "3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    s = json.loads((out / "summary.json").read_text())
    assert s["n"] == 8 and s["best_of"] == 4 and s["temperature"] == 1.0
    assert 0 <= s["best_of_n_accuracy"] <= s["pass_at_n"] <= 1 and s["greedy_accuracy"] == s["accuracy"]
    picks = [json.loads(x) for x in (out / "best_of_n.jsonl").read_text().splitlines()]
    assert len(picks) == 8 and sum(p["correct"] for p in picks) / 8 == s["best_of_n_accuracy"]
    assert "best-of-4 with" in capsys.readouterr().out
    w = tmp_path / "ev_w"
    argv = ["eval", str(sft_dir), "--best-of", "4", "--reward-model", str(rm), "--max-new-tokens", "3"]
    assert main([*argv, "--best-of-rule", "weighted", "--out", str(w)]) == 0
    sw = json.loads((w / "summary.json").read_text())
    assert (s["rule"], sw["rule"]) == ("max", "weighted") and sw["pass_at_n"] == s["pass_at_n"]  # the same samples
    assert "best-of-4 (weighted) with" in capsys.readouterr().out
    for argv, msg in (
        (["--best-of", "4"], "--best-of N and --reward-model RM go together"),
        (["--best-of", "4", "--reward-model", str(sft_dir)], "is not a reward-model checkpoint"),
        (["--best-of", "2", "--reward-model", str(rm), "--temperature", "0"], "--best-of needs --temperature > 0"),
    ):
        assert main(["eval", str(sft_dir), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1
