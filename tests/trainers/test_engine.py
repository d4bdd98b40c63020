"""The training engine: the one loop's cadence against a brute-force schedule, and the one registry against what the
command line, the pipeline and torchrun read."""

import inspect
from types import SimpleNamespace

import pytest

from posttrain.trainers.engine.registry import TRAINERS
from posttrain.trainers.engine.run import run
from posttrain.trainers.guards import NonFiniteGuard, TrainingDiverged


class FakeLogger:
    def __init__(self):
        self.steps, self.closed = [], False

    def log(self, step, metrics):
        self.steps.append(step)

    def close(self):
        self.closed = True


class FakeModel:
    def train(self, mode=True):
        return self


class FakeTrainer:
    """Records every call the loop makes; ``losses[step]`` is the loss of step ``step`` (0-based)."""

    def __init__(self, steps, eval_every, save_every, start=0, patience_at=None, losses=None, guard=None):
        self.name, self.model, self.start_step, self.run = "fake", FakeModel(), start, SimpleNamespace(dir="out")
        self.cfg = SimpleNamespace(steps=steps, eval_every=eval_every, save_every=save_every, progress=False)
        self.logger, self.guard, self.calls = FakeLogger(), guard, []
        self.patience_at, self.losses = patience_at, losses or {}

    def train_step(self, step):
        self.calls.append(("step", step))
        return {"loss": self.losses.get(step, 1.0), "grad_norm": 1.0}

    def evaluate(self, done, metrics):
        self.calls.append(("eval", done))

    def progress(self, metrics):
        return {}

    def early_stop(self, done):
        return "patience" if done == self.patience_at else None

    def save(self, done, metrics):
        self.calls.append(("save", done))

    def finish(self, stopped_at, t_start):
        self.calls.append(("finish", stopped_at))
        return {"stopped_at": stopped_at}


def schedule(steps, eval_every, save_every, start=0, stop=None, pause=None):
    """The calls the loop must make, written out step by step (the oracle)."""
    calls = []
    for step in range(start, steps):
        done = step + 1
        calls.append(("step", step))
        if (eval_every and done % eval_every == 0) or done == steps:
            calls.append(("eval", done))
        if done == stop:
            return calls + [("finish", done)]
        if (save_every and done % save_every == 0 and done != steps) or done == pause:
            calls.append(("save", done))
        if done == pause:
            return calls
    return calls + [("finish", None)]


@pytest.mark.parametrize(
    "steps, eval_every, save_every, start",
    [(7, 3, 2, 0), (6, 0, 0, 0), (6, 2, 3, 0), (9, 4, 4, 4), (5, 1, 1, 5), (1, 5, 5, 0)],
)
def test_the_loop_evaluates_saves_and_finishes_on_the_schedule(steps, eval_every, save_every, start):
    t = FakeTrainer(steps, eval_every, save_every, start=start)
    assert run(t) == {"stopped_at": None}
    assert t.calls == schedule(steps, eval_every, save_every, start)
    assert t.logger.steps == list(range(start + 1, steps + 1)) and t.logger.closed


def test_early_stop_finishes_at_that_step_without_its_checkpoint():
    t = FakeTrainer(10, 2, 3, patience_at=6)
    assert run(t) == {"stopped_at": 6}
    assert t.calls == schedule(10, 2, 3, stop=6)


def test_pause_saves_there_and_returns_without_finishing_then_a_resume_returns_at_once():
    t = FakeTrainer(10, 4, 0)
    out = run(t, pause_at=5)
    assert out["paused_at"] == 5 and t.calls == schedule(10, 4, 0, pause=5)
    again = FakeTrainer(10, 4, 0, start=5)
    assert run(again, pause_at=5) == {"paused_at": 5, "train_seconds": 0.0} and again.calls == []


def test_non_finite_steps_are_marked_and_a_streak_stops_the_run_with_no_final_model():
    nan = float("nan")
    t = FakeTrainer(10, 0, 0, losses={2: nan, 4: nan, 5: nan}, guard=NonFiniteGuard(2))
    with pytest.raises(TrainingDiverged, match="fake stopped at step 6: 2 steps in a row"):
        run(t)
    assert ("finish", None) not in t.calls and t.logger.steps == [1, 2, 3, 4, 5, 6] and t.logger.closed


def test_the_registry_is_what_the_command_line_the_pipeline_and_torchrun_read():
    from posttrain.cli import build_parser
    from posttrain.pipeline import distributed, stages

    sub = next(a for a in build_parser()._actions if isinstance(a.choices, dict))
    assert set(TRAINERS) <= set(sub.choices)
    assert distributed.COMMANDS == {e.module: name for name, e in TRAINERS.items()}
    trained = {s.name: s.run.trainer for s in stages.STAGES if hasattr(s.run, "trainer")}
    for stage, (module, fn) in trained.items():
        entry = TRAINERS[stage if stage in TRAINERS else "sft"]  # sft_raw is SFT on the raw corpus
        assert (module, fn) == (entry.module, entry.train)
    for name, e in TRAINERS.items():  # each entry names a real config, its presets and a train(cfg, resume, overwrite)
        cls, train = e.config_class(), e.train_fn()
        assert isinstance(e.presets(), dict) and cls.__dataclass_fields__
        assert list(inspect.signature(train).parameters)[:3] == ["cfg", "resume", "overwrite"], name


def test_the_names_runs_record_map_to_their_commands_through_the_registry():
    """run.json's trainer name -> the command line that makes it, read from the one registry (no list of its own in
    run_dir.py): each entry's recorded name is the one its module passes to the run, each variant's flag is one of
    its command's flags."""
    from pathlib import Path

    from posttrain.cli import build_parser
    from posttrain.trainers import run_dir
    from posttrain.trainers.engine.registry import command_of

    assert not hasattr(run_dir, "COMMANDS") and run_dir.command_of is command_of
    want = {"sft": "sft", "sft_restarts": "sft --restarts", "rm": "rm", "rm_eval": "rm --eval-only", "dpo": "dpo"}
    want |= {"policy_gradient": "grpo", "ppo": "ppo", "made_up": "made_up"}
    assert {name: command_of(name) for name in want} == want
    sub = next(a for a in build_parser()._actions if isinstance(a.choices, dict))
    root = Path(__file__).resolve().parents[2]
    for e in TRAINERS.values():
        source = (root / (e.module.replace(".", "/") + ".py")).read_text()
        assert f'"{e.recorded}"' in source, e.command
        flags = {s for a in sub.choices[e.command]._actions for s in a.option_strings}
        assert {flag for _, flag in e.variants} <= flags, e.command
