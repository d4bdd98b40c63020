"""Each alarm fires on its condition, after its patience, repeats on schedule, and resumes from its state."""

import json
import logging
import math

import pytest

from posttrain.errors import ConfigError
from posttrain.trainers.alarms import AlarmConfig, Alarms

HEALTHY = {
    "reward_mean": 0.4,
    "reward_std": 0.3,
    "zero_std_frac": 0.25,
    "truncated_frac": 0.1,
    "ratio_max": 1.3,
    "approx_kl": 0.01,
    "kl": 0.05,
    "entropy": 0.8,
    "loss": 0.12,
    "grad_norm": 1.5,
}


def _run(alarms, rows, start=0):
    return [alarms.update(start + i, {**HEALTHY, **row}) for i, row in enumerate(rows)]


def test_healthy_run_is_silent():
    a = Alarms()
    assert all(out == [] for out in _run(a, [{}] * 20))
    assert not a.skip_step and not a.should_stop and a.summary() == {"alarms_fired": {}, "skipped_steps": 0}


@pytest.mark.parametrize("mean,word", [(0.0, "all zero"), (1.0, "all identical")])
def test_identical_rewards_after_patience(mean, word):
    a = Alarms(AlarmConfig(reward_patience=3, repeat_every=4))
    outs = _run(a, [{"reward_mean": mean, "reward_std": 0.0, "zero_std_frac": 1.0}] * 11)
    fired_at = [i for i, o in enumerate(outs) if o]
    assert fired_at == [2, 6, 10]  # streak 3, then every 4 more steps
    assert word in outs[2][0] and "ALARM step 2" in outs[2][0]
    assert all(len(o) == 1 for o in outs if o)  # uniform groups are not reported twice
    # a healthy step resets the streak
    assert _run(a, [{}, {"reward_std": 0.0}, {"reward_std": 0.0}], start=11) == [[], [], []]


def test_uniform_groups():
    a = Alarms(AlarmConfig(reward_patience=2))
    outs = _run(a, [{"zero_std_frac": 1.0}] * 2)
    assert outs[0] == [] and "uniform" in outs[1][0]


def test_all_truncated():
    a = Alarms(AlarmConfig(truncation_patience=2))
    outs = _run(
        a, [{"truncated_frac": 1.0}, {"truncated_frac": 0.99}, {"truncated_frac": 1.0}, {"truncated_frac": 1.0}]
    )
    assert [bool(o) for o in outs] == [False, False, False, True] and "truncated" in outs[3][0]


@pytest.mark.parametrize(
    "key,value,word",
    [("ratio_max", 25.0, "importance ratio"), ("approx_kl", 0.9, "approx-KL"), ("kl", 3.0, "KL to the reference")],
)
def test_bounds_fire_immediately(key, value, word):
    a = Alarms()
    outs = _run(a, [{key: value}])
    assert len(outs[0]) == 1 and word in outs[0][0]
    assert a.summary()["alarms_fired"] != {}


def test_entropy_collapse():
    a = Alarms(AlarmConfig(entropy_floor=0.1, entropy_patience=2))
    outs = _run(a, [{"entropy": 0.05}, {"entropy": 0.02}])
    assert outs[0] == [] and "entropy collapse" in outs[1][0]


def test_missing_metrics_are_ignored():
    a = Alarms()
    assert a.update(0, {"loss": 0.3}) == []  # no reward/kl/entropy metrics: nothing to judge


@pytest.mark.parametrize("bad", [{"loss": float("nan")}, {"grad_norm": float("inf")}, {"loss": -math.inf}])
def test_non_finite_skips_then_stops(bad):
    a = Alarms(AlarmConfig(), nan_patience=3)
    _run(a, [bad])
    assert a.skip_step and not a.should_stop
    _run(a, [{}])  # a good step resets the streak
    assert not a.skip_step
    outs = _run(a, [bad, bad, bad])
    assert a.skip_step and a.should_stop and "stopping" in outs[2][0]
    assert a.summary()["skipped_steps"] == 4


def test_warnings_are_logged(caplog):
    a = Alarms()
    with caplog.at_level(logging.INFO, logger="posttrain.alarms"):
        out = a.update(7, {**HEALTHY, "ratio_max": 50.0})
    assert out and out[0] in caplog.messages


def test_state_round_trip_resumes_streaks():
    cfg = AlarmConfig(reward_patience=4)
    rows = [{"reward_std": 0.0, "reward_mean": 0.0}] * 6 + [{"loss": float("nan")}]
    full = Alarms(cfg)
    expected = _run(full, rows)
    first = Alarms(cfg)
    _run(first, rows[:3])
    state = json.loads(json.dumps(first.state_dict()))  # survives trainer_state.json
    resumed = Alarms(cfg)
    resumed.load_state_dict(state)
    assert _run(resumed, rows[3:], start=3) == expected[3:]
    assert resumed.state_dict() == full.state_dict()


def test_bad_config():
    with pytest.raises(ConfigError):
        AlarmConfig(entropy_patience=0)
