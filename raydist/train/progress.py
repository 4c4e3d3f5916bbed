"""The run's ETA on the progress lines: the run's remaining optimizer steps at its mean step time so far, plus its
remaining epoch ends (validation, checkpoint) at their mean measured time; "at most" when early stopping may end
the run sooner."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def span(step_ends: Sequence[float]) -> tuple[float, int]:
    """(seconds, steps) timed by one epoch's clock readings at its step ends: ``t_last − t_first`` over
    ``n − 1`` steps (the interval before the first end, data start-up, is not a step time)."""
    if len(step_ends) < 2:
        return 0.0, 0
    return step_ends[-1] - step_ends[0], len(step_ends) - 1


@dataclass
class RunClock:
    """The run's timing in this process, from the step ends of its epochs: finished epochs' step time and count,
    and every measured epoch end -- the time from an epoch's last step end to the next epoch's first, less one
    step (the next epoch's first step happens inside it)."""

    step_seconds: float = 0.0
    timed_steps: int = 0
    gaps: tuple[float, ...] = ()  # last step end → next epoch's first step end, per epoch boundary crossed
    last_step_end: float | None = None

    def finish_epoch(self, step_ends: Sequence[float]) -> None:
        """Fold a finished epoch's step ends in (before the next epoch's first step)."""
        if not step_ends:
            return
        self.gaps = self._gaps(step_ends)
        seconds, steps = span(step_ends)
        self.step_seconds += seconds
        self.timed_steps += steps
        self.last_step_end = step_ends[-1]

    def _gaps(self, step_ends: Sequence[float]) -> tuple[float, ...]:
        """The measured gaps, with the one into the epoch of ``step_ends`` once its first step has ended."""
        if self.last_step_end is None or not step_ends:
            return self.gaps
        return (*self.gaps, step_ends[0] - self.last_step_end)

    def seconds_per_step(self, step_ends: Sequence[float]) -> float | None:
        """Mean seconds per step over the run so far, the epoch in progress (``step_ends``) included; None
        before two steps of one epoch have ended."""
        seconds, steps = span(step_ends)
        steps += self.timed_steps
        return (self.step_seconds + seconds) / steps if steps else None

    def epoch_end_seconds(self, step_ends: Sequence[float]) -> float:
        """Mean seconds an epoch end adds (validation, checkpoint, the next epoch's data start), 0 before one
        has been measured."""
        gaps, per_step = self._gaps(step_ends), self.seconds_per_step(step_ends) or 0.0
        return max(sum(gaps) / len(gaps) - per_step, 0.0) if gaps else 0.0

    def eta(self, step_ends: Sequence[float], steps_left: int, epoch_ends_left: int) -> float | None:
        """Seconds to the end of the run: ``steps_left`` × :meth:`seconds_per_step` + ``epoch_ends_left`` ×
        :meth:`epoch_end_seconds`; None while no step time is known."""
        per_step = self.seconds_per_step(step_ends)
        if per_step is None:
            return None
        return steps_left * per_step + epoch_ends_left * self.epoch_end_seconds(step_ends)


def duration(seconds: float) -> str:
    """``3m05s``; ``1h02m`` from an hour."""
    whole = round(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 60}m{whole % 60:02d}s"


def eta_text(seconds: float | None, *, early_stopping: bool = False) -> str:
    """``run ETA 3m05s``, ``run ETA at most 3m05s`` when early stopping may end the run sooner, ``run ETA ?``
    while unknown."""
    if seconds is None:
        return "run ETA ?"
    return f"run ETA {'at most ' if early_stopping else ''}{duration(seconds)}"
