"""Stratified mini-batches over one worker's shard, strata = cluster assignments, with the weights that make
``Σ_i w_i ℓ_i / B`` an unbiased estimate of the shard's mean loss (and gradient)
(docs/algorithms.md#stratified-sampler).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

ALLOCATIONS = ("proportional", "equal")


def allocate(sizes: Tensor, batch_size: int, allocation: str = "proportional") -> Tensor:
    """Draws per stratum b_k with Σ_k b_k = B, b_k ≥ 1 on every non-empty stratum, 0 on empty ones.

    ``proportional``: quotas ``q_k = B·N_k/N``; ``b_k = max(1, ⌊q_k⌋)``; then while Σ b < B, +1 to the
    stratum with the largest ``q_k − b_k``; while Σ b > B, −1 from the stratum with b_k > 1 and the smallest
    ``q_k − b_k`` (ties: lowest k). So ``b_k = q_k`` whenever all quotas are integers, and ``b_k ≤ N_k``.
    ``equal``: ``⌊B/K'⌋`` each over the K' non-empty strata, +1 for the first ``B mod K'`` of them by
    decreasing N_k (ties: lowest k). Needs ``B ≥ K'``.
    """
    if allocation not in ALLOCATIONS:
        raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {allocation!r}")
    n = [int(s) for s in sizes.tolist()]
    nonempty = [k for k, s in enumerate(n) if s > 0]
    if batch_size < len(nonempty):
        raise ValueError(f"batch size {batch_size} < {len(nonempty)} non-empty strata")
    if allocation == "equal":
        base, extra = divmod(batch_size, len(nonempty))
        order = sorted(nonempty, key=lambda k: (-n[k], k))
        draws = [0] * len(n)
        for position, k in enumerate(order):
            draws[k] = base + int(position < extra)
        return torch.tensor(draws)
    total = sum(n)
    draws = [max(1, batch_size * s // total) if s else 0 for s in n]

    def excess(k: int) -> int:  # N·(q_k − b_k), exact in integers
        return batch_size * n[k] - draws[k] * total

    while sum(draws) < batch_size:
        draws[max(nonempty, key=lambda k: (excess(k), -k))] += 1
    while sum(draws) > batch_size:
        draws[min((k for k in nonempty if draws[k] > 1), key=lambda k: (excess(k), k))] -= 1
    return torch.tensor(draws)


def stratified_weights(strata: Tensor, sizes: Tensor, draws: Tensor, batch_size: int) -> Tensor:
    """``w_i = N_{k_i}/(N·b_{k_i})·B`` for the batch's strata k_i [B] (sizes N_k, actual draws b_k)."""
    sizes, draws = sizes.double(), draws.double()
    return sizes[strata] / (sizes.sum() * draws[strata]) * batch_size


@dataclass
class StratifiedBatch:
    """Row indices into the shard [B] and their weights [B]; the batch estimate is ``Σ_i w_i ℓ_i / B``."""

    indices: Tensor
    weights: Tensor


class StratifiedSampler:
    """Batches that draw b_k rows (:func:`allocate`) from every stratum k of ``strata`` [N] (any integer
    labels, e.g. cluster ids with −1 for rows not yet assigned), weighted by :func:`stratified_weights`.

    Within a stratum the b_k rows are distinct (uniform without replacement) when ``b_k ≤ N_k`` and
    ``replacement`` is False, else b_k independent uniform draws; either way each draw is uniform over
    the stratum, so ``E[Σ_i w_i ℓ_i / B] = Σ_k (N_k/N)·mean_{i∈k} ℓ_i = mean_i ℓ_i``.
    When B is smaller than the number of non-empty strata no batch can hold all of them; batches are then
    B distinct rows uniform over the shard with weights 1 (also unbiased, not stratified).
    Epoch e of seed s draws from a generator seeded with ``numpy.random.SeedSequence((s, e))``'s first
    32-bit word: deterministic, and distinct (s, e) give unrelated streams.
    """

    def __init__(
        self,
        strata: Tensor,
        batch_size: int,
        *,
        allocation: str = "proportional",
        replacement: bool = False,
        seed: int = 0,
        num_batches: int | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        labels, inverse, counts = torch.unique(strata, return_inverse=True, return_counts=True)
        self.num_rows, self.batch_size = strata.shape[0], batch_size
        if batch_size > self.num_rows:
            raise ValueError(f"batch size {batch_size} > {self.num_rows} rows")
        self.labels, self.sizes = labels, counts
        self._members = torch.argsort(inverse, stable=True).split(counts.tolist())
        self.stratified = batch_size >= labels.shape[0]
        self.replacement, self.seed = replacement, seed
        if self.stratified:
            self.draws = allocate(counts, batch_size, allocation)
            strata = torch.arange(labels.shape[0]).repeat_interleave(self.draws)
            self._weights = stratified_weights(strata, counts, self.draws, batch_size).to(dtype)
        else:
            self.draws, self._weights = None, torch.ones(batch_size, dtype=dtype)
        self.num_batches = num_batches if num_batches is not None else max(1, self.num_rows // batch_size)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s draws on the next iteration."""
        self.epoch = epoch

    def sample(self, generator: torch.Generator) -> StratifiedBatch:
        """One batch drawn with ``generator``."""
        if self.draws is None:
            indices = torch.randperm(self.num_rows, generator=generator)[: self.batch_size]
            return StratifiedBatch(indices, self._weights.clone())
        picks = []
        for members, b in zip(self._members, self.draws.tolist(), strict=False):
            if self.replacement or b > members.shape[0]:
                picks.append(members[torch.randint(members.shape[0], (b,), generator=generator)])
            else:
                picks.append(members[torch.randperm(members.shape[0], generator=generator)[:b]])
        return StratifiedBatch(torch.cat(picks), self._weights.clone())

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[StratifiedBatch]:
        word = np.random.SeedSequence((self.seed, self.epoch)).generate_state(1)[0]
        generator = torch.Generator().manual_seed(int(word))
        for _ in range(self.num_batches):
            yield self.sample(generator)
