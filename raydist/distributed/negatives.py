"""Cross-worker hard-negative mining: the global negative set and its random subsets.

This module only chooses rows and keys; the ranking loss on them, its scaling and its one-call entry points
(:func:`raydist.losses.cross_worker_ranking_loss`, :func:`raydist.losses.step_ranking_loss`) are
:mod:`raydist.losses.kinds.ranking`.
:class:`StepPlan` holds the rows-per-step rule; a run computes it once and passes it along.

Row positions. Each of the W ranks holds ``m`` rows; global position of local row i on rank r is
``r·m + i`` (rank-major, the order of :func:`all_gather_with_grad`).

Negative set (thesis Fig. 3.6, "negative set size" n; the query count is ``batch_size`` = train.batch_size):

* queries: when ``batch_size < W·m`` each rank takes ``batch_size / W`` of its own rows; otherwise all rows.
* keys: when ``n < W·m`` a common random subset of n global positions, shared by every query; otherwise
  all W·m rows. A query's own positive pair is always scored (the positive is its own row, not a key), and
  keys with the query's image id are never negatives.

Draws (made identically on every rank, from the caller's ``generator``, which every rank seeds the same
way — the training loop uses :func:`step_generator` (seed, global step)), in order:

1. only if ``batch_size < W·m``: for r = 0 … W−1, ``torch.randperm(m, generator)[:batch_size // W]`` —
   rank r's query rows (every rank makes all W draws and keeps its own, sorted);
2. only if ``n < W·m``: ``torch.randperm(W·m, generator)[:n]`` — the key positions (sorted).

With :class:`StepPlan` the loop fetches ``W·m = max(batch_size, n)`` rows, so at most one draw happens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


def rows_per_worker(batch_size: int, negative_set_size: int | None, world_size: int) -> int:
    """Rows each worker embeds per step: ``max(batch_size, negative_set_size) / W``.

    ``batch_size`` is the global query count; a negative set larger than it is embedded in full and the
    queries are a subset of it. Raises ValueError when the counts do not divide over the W workers.
    """
    rows = batch_size
    if negative_set_size is not None and negative_set_size > batch_size:
        rows = negative_set_size
    if batch_size % world_size or rows % world_size:
        raise ValueError(
            f"batch_size={batch_size} and rows per step={rows} must divide over {world_size} workers"
        )
    return rows // world_size


def step_generator(seed: int, global_step: int, stream: int = 0) -> torch.Generator:
    """The generator of a step's draws, identical on every rank: seeded by (seed, step, stream); stream 0
    is the negative-set draw, stream 1 a miner's random picks."""
    return torch.Generator().manual_seed((seed * 1_000_003 + global_step) * 7 + stream)


@dataclass(frozen=True)
class NegativeSet:
    """This rank's query rows (local positions) and the common key positions (global; None = all rows)."""

    query_rows: Tensor
    key_rows: Tensor | None


@dataclass(frozen=True)
class StepPlan:
    """The step's row plan, computed once per run: global query batch, negative-set size and world size
    give the rows each worker embeds (:func:`rows_per_worker`) and the draws of each step."""

    batch_size: int
    negative_set_size: int | None
    world: int
    rows_per_worker: int = field(init=False)

    def __post_init__(self) -> None:
        rows = rows_per_worker(self.batch_size, self.negative_set_size, self.world)
        object.__setattr__(self, "rows_per_worker", rows)

    @property
    def rows_per_step(self) -> int:
        """Rows all workers embed together in one step."""
        return self.rows_per_worker * self.world

    def draw(self, rank: int, generator: torch.Generator | None) -> NegativeSet:
        """This step's draws for rank ``rank`` (module docstring, "Draws")."""
        return sample_negative_set(
            self.rows_per_worker,
            self.world,
            rank,
            batch_size=self.batch_size,
            negative_set_size=self.negative_set_size,
            generator=generator,
        )


def sample_negative_set(
    rows: int,
    world: int,
    rank: int,
    *,
    batch_size: int | None,
    negative_set_size: int | None,
    generator: torch.Generator | None,
) -> NegativeSet:
    """Make this step's draws (module docstring, "Draws") and return rank ``rank``'s share."""
    total = rows * world
    batch_size = total if batch_size is None else batch_size
    if batch_size > total or batch_size % world:
        raise ValueError(f"batch_size={batch_size} queries cannot be split over {world} ranks of {rows} rows")
    draw_queries = batch_size < total
    draw_keys = negative_set_size is not None and negative_set_size < total
    if (draw_queries or draw_keys) and generator is None:
        raise ValueError("a negative-set subset needs a torch.Generator seeded identically on every rank")
    query_rows = torch.arange(rows)
    if draw_queries:
        per_rank = batch_size // world
        draws = [torch.randperm(rows, generator=generator)[:per_rank] for _ in range(world)]
        query_rows = draws[rank].sort().values
    key_rows = None
    if draw_keys:
        key_rows = torch.randperm(total, generator=generator)[:negative_set_size].sort().values
    return NegativeSet(query_rows=query_rows, key_rows=key_rows)
