"""Stopping a run from outside at a step boundary: the driver turns SIGINT/SIGTERM into a stop file in the
run folder (:func:`stop_on_signals`; a local folder or object storage, ``s3://…``); every worker's
:class:`StopFileHook` looks for it after each step."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import torch

from raydist.distributed.reduce import all_reduce_sum
from raydist.tasks import StepContext
from raydist.train.hooks import Hook
from raydist.uris import delete, file_type, is_uri, write_bytes

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
REMOTE_CHECK_S = 1.0  # at most one request per second per worker for a stop file on object storage


class StopFileHook(Hook):
    """Asks the loop to stop when ``path`` exists. Every rank looks, and one all-reduce per step makes the
    answer the same on all ranks (any rank that sees the file stops them all at the same step). A stop file on
    object storage is looked for at most every :data:`REMOTE_CHECK_S` seconds (a failed look counts as not
    there), a local one after every step."""

    def __init__(self, path: str | Path) -> None:
        self.path = path if is_uri(path) else Path(path)
        self._seen, self._looked = False, float("-inf")

    def _exists(self) -> bool:
        if isinstance(self.path, Path):
            return self.path.exists()
        if not self._seen and time.monotonic() - self._looked >= REMOTE_CHECK_S:
            self._looked = time.monotonic()
            try:
                self._seen = file_type(self.path) != "missing"
            except ValueError:  # the store did not answer this time: look again later
                self._seen = False
        return self._seen

    def stop_requested(self, ctx: StepContext) -> bool:
        seen = torch.tensor([float(self._exists())], dtype=torch.float64)
        return bool(all_reduce_sum(seen).item() > 0)


@dataclass
class StopSignals:
    """What :func:`stop_on_signals` saw: ``count`` signals so far."""

    stop_file: str | Path | None
    count: int = 0

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for."""
        return self.count > 0


def _write_console(text: str) -> None:
    """Write straight to stdout's file descriptor: a signal handler may run while the console holds its lock."""
    os.write(1, text.encode())


@contextmanager
def stop_on_signals(stop_file: str | Path | None) -> Iterator[StopSignals]:
    """While inside: the first SIGINT/SIGTERM writes ``stop_file`` (a local path or a URI: the workers then
    checkpoint at the next step boundary and end) and says so; a second one raises KeyboardInterrupt (quit at
    once). Without a stop file the first signal already raises KeyboardInterrupt. A stale stop file is removed
    on entry and the stop file on exit, so a resumed run does not stop at once. Off the main thread (signals
    cannot be caught there) nothing is installed."""
    signals = StopSignals(stop_file)
    if stop_file is not None:
        delete(stop_file)
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
                f"\n[raydist] {name}: the workers cannot be told to stop at a step boundary: quitting now\n"
            )
            raise KeyboardInterrupt
        write_bytes(stop_file, b"")
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
            delete(stop_file)
