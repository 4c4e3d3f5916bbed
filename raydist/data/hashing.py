"""Per-row random numbers that are a pure function of a row's id and a seed, so every worker, epoch,
shard order and writer agrees on them (label noise, train subsets)."""

from __future__ import annotations

import numpy as np


def uniform_by_id(ids: np.ndarray, seed: int, stream: int = 0) -> np.ndarray:
    """A uniform [0, 1) number per id from (id, seed, stream): the splitmix64 finaliser of the mixed id."""
    with np.errstate(over="ignore"):
        z = np.asarray(ids).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z ^= np.uint64((seed * 0x2545F4914F6CDD1D + stream * 0x94D049BB133111EB) % 2**64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) / 2.0**53
