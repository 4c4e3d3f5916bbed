"""Continuous batching for a replica: requests queue while a batch runs, and the next batch takes every request
waiting then (up to ``max_batch``), so the batch size follows the load -- one request at one client, about N at N
concurrent clients -- with no fixed wait on an idle server.

Ray Serve's ``@serve.batch`` forms a batch after its timeout whether or not the previous one has finished, so under
load its batches queue up small (measured: 1.8 requests on average at 8 clients with 16 / 5 ms, each waiting behind
the last); here a batch is formed only when the runner is free.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

Item = TypeVar("Item")
Answer = TypeVar("Answer")


@dataclass(frozen=True)
class Batched(Generic[Answer]):
    """One request's answer and how it was batched: seconds queued before its batch started, seconds its batch
    ran, the batch's size and what the runner reported of it (``parts``: name → seconds)."""

    answer: Answer
    queued_s: float
    run_s: float
    size: int
    parts: dict[str, float]


class Batcher(Generic[Item, Answer]):
    """Runs ``run(items, parts)`` -- a blocking function answering a batch in order, filling ``parts`` with the
    seconds of its stages -- in a worker thread, one batch at a time. ``wait_s``: how long the first request to
    reach an idle batcher waits for others before its batch starts (0: not at all; the batch grows with the
    queue alone). Create it inside the replica; its worker task starts on the first :meth:`submit`."""

    def __init__(
        self,
        run: Callable[[Sequence[Item], dict[str, float]], Sequence[Answer]],
        max_batch: int,
        wait_s: float = 0.0,
    ) -> None:
        if max_batch < 1 or wait_s < 0:
            raise ValueError(f"max_batch {max_batch}, wait_s {wait_s}: expected >= 1 and >= 0")
        self.run, self.max_batch, self.wait_s = run, max_batch, wait_s
        self._queue: deque[tuple[Item, float, asyncio.Future[Batched[Answer]]]] = deque()
        self._arrived: asyncio.Event | None = None
        self._full: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None

    async def submit(self, item: Item) -> Batched[Answer]:
        """``item`` answered in the next batch that has room for it."""
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._arrived, self._full = asyncio.Event(), asyncio.Event()
            self._worker = loop.create_task(self._work())
        future: asyncio.Future[Batched[Answer]] = loop.create_future()
        self._queue.append((item, time.perf_counter(), future))
        self._arrived.set()
        if len(self._queue) >= self.max_batch:
            self._full.set()
        return await future

    async def _work(self) -> None:
        assert self._arrived is not None and self._full is not None
        while True:
            await self._arrived.wait()
            if self.wait_s and len(self._queue) < self.max_batch:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), self.wait_s)
            batch = []
            while self._queue and len(batch) < self.max_batch:
                entry = self._queue.popleft()
                if not entry[2].done():  # a request whose client went away is not answered
                    batch.append(entry)
            if not self._queue:
                self._arrived.clear()
            if len(self._queue) < self.max_batch:
                self._full.clear()
            if batch:
                await self._answer(batch)

    async def _answer(self, batch: list[tuple[Item, float, asyncio.Future[Batched[Answer]]]]) -> None:
        parts: dict[str, float] = {}
        start = time.perf_counter()
        try:
            answers = await asyncio.to_thread(self.run, [item for item, _, _ in batch], parts)
        except Exception as e:  # noqa: BLE001 -- every request of the batch gets the error, re-raised there
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(e)
            return
        ran = time.perf_counter() - start
        for (_, queued, future), answer in zip(batch, answers, strict=True):
            if not future.done():
                future.set_result(Batched(answer, start - queued, ran, len(batch), parts))
