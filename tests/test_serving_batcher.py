"""raydist.serving.batcher (continuous batching in a replica, no Ray): one caller is answered alone and at once; the
requests that arrive while a batch runs are answered together in the next, at most max_batch at a time; wait_s
holds an idle batcher's first request for company until the batch is full; an error reaches every request of its
batch and the batcher keeps serving; a request given up while queued is not run."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from raydist.serving.batcher import Batcher


class Runner:
    """A batch function that records its batches, answers ``-item``, and (``hold``) blocks its first batch until
    released, so that others queue meanwhile."""

    def __init__(self, hold: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        if not hold:
            self.release.set()

    def __call__(self, items: Sequence[int], parts: dict[str, float]) -> list[int]:
        self.batches.append(list(items))
        parts["work"] = 0.5
        self.started.set()
        assert self.release.wait(30)
        if any(i < 0 for i in items):
            raise ValueError(f"negative item in {list(items)}")
        return [-i for i in items]


async def _busy(batcher: Batcher, runner: Runner) -> asyncio.Future:
    """Request 0 submitted and its batch running (held by ``runner``): the future of its answer."""
    first = asyncio.ensure_future(batcher.submit(0))
    await asyncio.to_thread(runner.started.wait, 30)
    return first


def test_one_caller_is_answered_alone_and_at_once():
    runner = Runner()

    async def main():
        batcher = Batcher(runner, max_batch=8)
        return [await batcher.submit(i) for i in range(3)]

    out = asyncio.run(main())
    assert [o.answer for o in out] == [0, -1, -2] and runner.batches == [[0], [1], [2]]
    assert [o.size for o in out] == [1, 1, 1] and all(o.parts == {"work": 0.5} for o in out)
    assert all(0 <= o.queued_s < 1 and o.run_s >= 0 for o in out)


def test_requests_arriving_during_a_batch_are_answered_together_up_to_max_batch():
    runner = Runner(hold=True)

    async def main():
        batcher = Batcher(runner, max_batch=4)
        first = await _busy(batcher, runner)  # the first batch runs ...
        rest = [asyncio.ensure_future(batcher.submit(i)) for i in range(1, 7)]
        await asyncio.sleep(0)  # ... while six more queue
        runner.release.set()
        return await asyncio.gather(first, *rest)

    out = asyncio.run(main())
    assert runner.batches == [[0], [1, 2, 3, 4], [5, 6]]
    assert [o.answer for o in out] == [0, -1, -2, -3, -4, -5, -6]
    assert [o.size for o in out] == [1, 4, 4, 4, 4, 2, 2]


@pytest.mark.timeout(20)
def test_wait_holds_the_first_request_for_company_until_the_batch_is_full():
    runner = Runner()

    async def main():
        batcher = Batcher(runner, max_batch=2, wait_s=60.0)  # a full batch ends the wait, not the 60 s
        first = asyncio.ensure_future(batcher.submit(1))
        await asyncio.sleep(0.05)
        return await asyncio.gather(first, batcher.submit(2))

    out = asyncio.run(main())
    assert runner.batches == [[1, 2]] and [o.size for o in out] == [2, 2]


def test_an_error_reaches_every_request_of_its_batch_and_the_next_batch_is_served():
    runner = Runner(hold=True)

    async def main():
        batcher = Batcher(runner, max_batch=4)
        first = await _busy(batcher, runner)  # the first batch runs ...
        bad = [asyncio.ensure_future(batcher.submit(i)) for i in (3, -1)]
        await asyncio.sleep(0)  # ... while these queue
        runner.release.set()
        await first
        errors = await asyncio.gather(*bad, return_exceptions=True)
        return errors, await batcher.submit(5)

    errors, after = asyncio.run(main())
    assert all(isinstance(e, ValueError) and "negative item in [3, -1]" in str(e) for e in errors)
    assert after.answer == -5 and runner.batches[-1] == [5]


def test_a_request_given_up_while_queued_is_not_run():
    runner = Runner(hold=True)

    async def main():
        batcher = Batcher(runner, max_batch=4)
        first = await _busy(batcher, runner)  # the first batch runs ...
        gone, kept = asyncio.ensure_future(batcher.submit(1)), asyncio.ensure_future(batcher.submit(2))
        await asyncio.sleep(0)
        gone.cancel()  # e.g. its client disconnected
        runner.release.set()
        return await asyncio.gather(first, kept)

    out = asyncio.run(main())
    assert runner.batches == [[0], [2]] and [o.answer for o in out] == [0, -2]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_batch 0"):
        Batcher(Runner(), max_batch=0)
    with pytest.raises(ValueError, match="wait_s -1"):
        Batcher(Runner(), max_batch=1, wait_s=-1)
