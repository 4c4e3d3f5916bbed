"""The GC benchmark's ratio cell: the spread of GC / plain over consecutive blocks of the alternating steps."""

from __future__ import annotations

import statistics

from raydist.benchmarks.gradclust import block_ratios


def test_block_ratios_are_per_block_ratios_of_medians() -> None:
    off = [1.0, 2.0, 3.0, 1.0, 1.0, 5.0, 2.0]
    on = [2.0, 2.0, 9.0, 3.0, 3.0, 3.0, 8.0]
    got = block_ratios(on, off, 2)  # blocks of 3 steps, the 7th joins the last
    want = [
        statistics.median(on[:3]) / statistics.median(off[:3]),
        statistics.median(on[3:]) / statistics.median(off[3:]),
    ]
    assert got == want == [1.0, 2.0]
    assert block_ratios(on[:2], off[:2], 5) == [2.0, 1.0]  # fewer steps than blocks: one block per step
