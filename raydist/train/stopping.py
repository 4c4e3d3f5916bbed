"""Stopping a run from outside at a step boundary: the driver turns SIGINT/SIGTERM into a stop file in the
run folder (:func:`stop_on_signals`); every worker's :class:`StopFileHook` looks for it after each step."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import torch

from raydist.distributed.reduce import all_reduce_sum
from raydist.tasks import StepContext
from raydist.train.hooks import Hook

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopFileHook(Hook):
    """Asks the loop to stop when ``path`` exists. Every rank looks, and one all-reduce per step makes the
    answer the same on all ranks (any rank that sees the file stops them all at the same step)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def stop_requested(self, ctx: StepContext) -> bool:
        seen = torch.tensor([float(self.path.exists())], dtype=torch.float64)
        return bool(all_reduce_sum(seen).item() > 0)


@dataclass
class StopSignals:
    """What :func:`stop_on_signals` saw: ``count`` signals so far."""

    stop_file: Path | None
    count: int = 0

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for."""
        return self.count > 0


def _write_console(text: str) -> None:
    """Write straight to stdout's file descriptor: a signal handler may run while the console holds its lock."""
    os.write(1, text.encode())


@contextmanager
def stop_on_signals(stop_file: Path | None) -> Iterator[StopSignals]:
    """While inside: the first SIGINT/SIGTERM writes ``stop_file`` (the workers then checkpoint at the next
    step boundary and end) and says so; a second one raises KeyboardInterrupt (quit at once). Without a
    stop file (the run folder is on remote storage, which the workers cannot be signalled through) the first
    signal already raises KeyboardInterrupt. A stale stop file is removed on entry and the stop file on exit,
    so a resumed run does not stop at once. Off the main thread (signals cannot be caught there) nothing is
    installed."""
    signals = StopSignals(stop_file)
    if stop_file is not None:
        stop_file.unlink(missing_ok=True)
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        signals.count += 1
        name = signal.Signals(signum).name
        if signals.count > 1:
            _write_console(f"\n[raydist] {name} again: quitting now, without a checkpoint\n")
            raise KeyboardInterrupt
        if stop_file is None:
            _write_console(
                f"\n[raydist] {name}: the run folder is on remote storage, so the workers cannot be "
                "told to stop at a step boundary: quitting now\n"
            )
            raise KeyboardInterrupt
        stop_file.parent.mkdir(parents=True, exist_ok=True)
        stop_file.touch()
        _write_console(
            f"\n[raydist] {name}: stopping at the next step boundary and saving a checkpoint "
            "(press Ctrl-C again to quit at once)\n"
        )

    previous = {s: signal.signal(s, handle) for s in STOP_SIGNALS}
    try:
        yield signals
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
        if stop_file is not None:
            stop_file.unlink(missing_ok=True)
