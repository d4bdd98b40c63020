"""The loop decisions every trainer shares (trainers/common.py), against hand-listed schedules."""

import pytest

from posttrain.errors import UserError
from posttrain.trainers.common import check_resume_step, should_eval, should_save


def test_eval_cadence_is_every_n_steps_plus_the_last():
    assert [d for d in range(1, 8) if should_eval(d, 3, 7)] == [3, 6, 7]
    assert [d for d in range(1, 7) if should_eval(d, 3, 6)] == [3, 6]
    assert [d for d in range(1, 8) if should_eval(d, 0, 7)] == [7]  # 0: only at the end


def test_periodic_saves_skip_the_last_step_which_writes_model():
    assert [d for d in range(1, 8) if should_save(d, 3, 7)] == [3, 6]
    assert [d for d in range(1, 7) if should_save(d, 3, 6)] == [3]
    assert [d for d in range(1, 8) if should_save(d, 0, 7)] == []


def test_resume_step_at_or_below_steps_passes_and_beyond_is_one_line():
    check_resume_step("ck", 5, 5)
    with pytest.raises(UserError) as e:
        check_resume_step("runs/x/model", 6, 5)
    assert str(e.value) == "checkpoint runs/x/model is at step 6, beyond steps=5"
