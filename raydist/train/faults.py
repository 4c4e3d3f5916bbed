"""Fault injection for tests and chaos drills: a hook, never part of the loop itself."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from raydist.tasks import StepContext
from raydist.train.hooks import Hook


class FailAtStep(Hook):
    """Rank ``rank`` exits hard (``os._exit(1)``) once, before global step ``step``; a marker file in
    ``marker_dir`` keeps the restarted worker from failing again."""

    def __init__(self, step: int, rank: int, marker_dir: str | Path) -> None:
        self.step, self.rank, self.marker_dir = step, rank, Path(marker_dir)

    def before_step(self, ctx: StepContext) -> None:
        if ctx.rank != self.rank or ctx.global_step != self.step:
            return
        marker = self.marker_dir / f"fault-injected-rank{ctx.rank}-step{ctx.global_step}"
        if marker.exists():
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        sys.stdout.write(f"[raydist] fault injection: rank {ctx.rank} exits hard at step {ctx.global_step}\n")
        sys.stdout.flush()
        os._exit(1)


class SlowSteps(Hook):
    """Every rank sleeps ``seconds`` before each step: a run slow enough to be stopped or killed mid-epoch."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def before_step(self, ctx: StepContext) -> None:
        time.sleep(self.seconds)
