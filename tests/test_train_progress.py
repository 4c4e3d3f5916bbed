"""The progress lines' ETA (raydist/train/progress.py, issue #51): labelled as the run's, counted from the run's
remaining steps at its mean step time plus its remaining epoch ends (validation, checkpoint) at their measured
time, "at most" under early stopping -- checked against the end time of a simulated run's own clock."""

from __future__ import annotations

import pytest

from raydist.train.loop import Progress
from raydist.train.progress import RunClock, duration, eta_text


def simulated_step_ends(
    epochs: int, steps: int, step_s: list[float], epoch_end_s: float
) -> list[list[float]]:
    """Each epoch's clock readings at its step ends: steps take ``step_s[epoch]`` seconds, every epoch end
    (validation, checkpoint) ``epoch_end_s``; the run ends after the last epoch's end."""
    ends, t = [], 0.0
    for epoch in range(epochs):
        epoch_ends = []
        for _ in range(steps):
            t += step_s[epoch]
            epoch_ends.append(t)
        ends.append(epoch_ends)
        t += epoch_end_s
    return ends


def test_the_eta_is_the_time_left_of_a_run_with_steady_steps_and_epoch_ends():
    epochs, steps, epoch_end_s = 4, 5, 7.0
    ends = simulated_step_ends(epochs, steps, [2.0] * epochs, epoch_end_s)
    run_end = ends[-1][-1] + epoch_end_s
    p = Progress(epochs, steps, rows_per_step=10)
    for epoch in range(epochs):
        p.start_epoch()
        for step, t in enumerate(ends[epoch], 1):
            p.times.append(t)
            eta = p.clock.eta(p.times, epochs * steps - (epoch * steps + step), epochs - epoch)
            if epoch == 0 and step < 2:
                assert eta is None and p.line(epoch, step).endswith("run ETA ?")
            elif epoch == 0:  # no epoch end timed yet: the steps alone
                assert eta == pytest.approx(run_end - t - (epochs - epoch) * epoch_end_s)
            else:  # exact from the first step of the second epoch on
                assert eta == pytest.approx(run_end - t)
                assert p.line(epoch, step).endswith(f"run ETA {duration(run_end - t)}")


def test_the_eta_uses_the_runs_mean_step_time_not_the_last_epochs():
    """A slow first epoch and fast later ones: the ETA follows the run's mean over every step timed so far."""
    ends = simulated_step_ends(3, 4, [3.0, 1.0, 1.0], 0.0)
    p = Progress(3, 4, rows_per_step=10)
    for epoch_ends in ends[:2]:
        p.start_epoch()
        p.times.extend(epoch_ends)
    # timed: epoch 1's 3 intervals of 3 s, epoch 2's 3 of 1 s; the boundary gap is one 1-s step, no epoch end
    assert p.clock.seconds_per_step(p.times) == pytest.approx((9 + 3) / 6)
    assert p.clock.epoch_end_seconds(p.times) == pytest.approx(0.0)
    assert p.clock.eta(p.times, 4, 1) == pytest.approx(4 * 2.0)


def test_early_stopping_makes_it_at_most_and_the_label_says_whose_eta_it_is():
    p = Progress(2, 10, rows_per_step=64, early_stopping=True)
    p.times = [0.0, 1.0, 2.0]
    line = p.line(epoch=0, step_in_epoch=5)
    assert line == "epoch 1/2 step 5/10 (50%) samples/s 64 run ETA at most 0m15s"
    assert eta_text(None, early_stopping=True) == "run ETA ?"
    assert [duration(s) for s in (0.4, 59.6, 185, 3600, 3725)] == [
        "0m00s",
        "1m00s",
        "3m05s",
        "1h00m",
        "1h02m",
    ]


def test_a_resumed_run_counts_only_its_own_clock():
    clock = RunClock()
    clock.finish_epoch([])  # an epoch that ran no step here (resumed at its end)
    assert clock.eta([5.0], 10, 1) is None and clock.gaps == ()
    clock.finish_epoch([5.0, 6.0])
    assert clock.eta([10.0, 11.0], 3, 1) == pytest.approx(3 * 1.0 + (4.0 - 1.0))
