"""Tail weight averaging (trainers/weight_average.py): the steps, and frozen parameters and buffers left as they are
(GRPO's final model against an un-averaged run's checkpoints, and its resume: tests/trainers/test_policy_gradient.py)."""

import torch

from posttrain.trainers.weight_average import TailAverage, average_steps


def test_average_steps():
    assert average_steps(700, 3, 100) == [500, 600, 700]
    assert average_steps(150, 3, 100) == [50, 150]  # steps before the first are dropped
    assert average_steps(700, 1, 100) == [700]
    assert not TailAverage(700, 1, 100).active and TailAverage(700, 2, 100).active


def test_frozen_parameters_and_buffers_are_not_averaged():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    m[0].bias.requires_grad_(False)
    buf = m[1].running_mean.clone()
    tail, seen = TailAverage(3, 3, 1), []
    for done in (1, 2, 3):
        with torch.no_grad():
            m[0].weight.add_(float(done))
            m[0].bias.mul_(3.0)  # a frozen parameter that changes anyway is not averaged either
        seen.append(m[0].weight.clone())
        assert tail.add(m, done)
    frozen = m[0].bias.clone()  # its last value
    assert tail.apply(m)
    torch.testing.assert_close(m[0].weight, (seen[0] + seen[1] + seen[2]) / 3, atol=1e-6, rtol=0)
    assert torch.equal(m[0].bias, frozen) and torch.equal(m[1].running_mean, buf)
