"""Gradient clustering in the training loop: a hook that captures layer statistics during training steps,
runs reassignment passes over the worker's shard, measures SGD vs GC gradient variance, and (``gc.sample``)
replaces the epoch's batches by GC-stratified batches with unbiased weights."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from raydist.checkpoint import StateRegistry
from raydist.config import Config, ConfigError
from raydist.gradclust.clustering import GradientClustering
from raydist.gradclust.layers import unsupported_layers
from raydist.gradclust.sampler import StratifiedSampler
from raydist.gradclust.variance import measure_gradient_variance
from raydist.tasks import StepContext, Task, to_tensors
from raydist.train.hooks import Hook

Batch = dict[str, np.ndarray]


class ShardRows(Sequence):
    """Rows of a worker's in-memory shard as dicts of tensors (the variance meter's dataset)."""

    def __init__(self, arrays: Batch) -> None:
        self.arrays = {k: v for k, v in arrays.items() if v.dtype != object}
        self.n = len(next(iter(self.arrays.values())))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Tensor]:  # type: ignore[override]
        return {k: torch.as_tensor(np.asarray(v[i])) for k, v in self.arrays.items()}


def worker_shard(arrays: Batch, *, rank: int, world: int, seed: int) -> Batch:
    """This worker's fixed shard for GC: rows ``perm[rank::world]`` of a seeded permutation, cut to
    ``N // world`` rows so every worker holds the same count."""
    n = len(next(iter(arrays.values())))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + 11)).numpy()
    rows = perm[rank::world][: n // world]
    return {k: v[rows] for k, v in arrays.items()}


class GradientClusteringHook(Hook):
    """``gc.measure``: statistics from every ``gc.stats_every``-th training step (the task's loss backpropagated as a sum of
    per-row contributions, ``loss_scale`` from :meth:`Task.row_loss_scale`), a reassignment pass over the
    shard every ``gc.reassign_every`` epochs, and every ``gc.log_every`` steps the variance meter
    (T = ``gc.variance_batches`` extra batches from its own generator).
    ``gc.sample``: the epoch's batches are drawn by :class:`StratifiedSampler` over the shard's clusters,
    with weights ``w_i = N_k / (N·b_k) · B`` scaling each row's gradient contribution (unbiased for losses
    that are means of per-example terms; a heuristic otherwise); statistics then come from the reassignment
    passes only (the training gradients are weighted). Losses that are not sums over rows are clustered by
    their per-row contributions (docs/algorithms.md#gradient-clustering)."""

    def __init__(
        self,
        cfg: Config,
        task: Task,
        arrays: Batch | None,
        *,
        rank: int,
        world: int,
        rows: int,
        device: Any = "cpu",
    ) -> None:
        if arrays is None:
            raise ConfigError(
                "gradient clustering (gc.measure / gc.sample) needs an in-memory train split: "
                "raise data.in_memory_max_mb"
            )
        self.cfg, self.task, self.rank, self.rows, self.device = cfg, task, rank, rows, device
        self.shard = worker_shard(arrays, rank=rank, world=world, seed=cfg.train.seed)
        self.shard_ids = torch.as_tensor(self.shard["sample_id"])
        self.meter_generator = torch.Generator().manual_seed(cfg.train.seed * 104729 + rank)
        self.measurements: list[dict[str, float]] = []
        self.gc: GradientClustering | None = None
        self.model: nn.Module | None = None

    def setup(self, model: nn.Module, registry: StateRegistry) -> None:
        g = self.cfg.gc
        self.model = model
        self.gc = GradientClustering(
            model, g.num_clusters, mode=g.mode, update_every=g.update_every, seed=self.cfg.train.seed
        )
        registry.register("gradclust", self.gc)
        if self.rank == 0:
            by_reason: dict[str, list[str]] = {}  # one reason once: a transformer repeats it per layer
            for name, why in unsupported_layers(model):
                by_reason.setdefault(why, []).append(name)
            skipped = "; ".join(f"{', '.join(names)} ({why})" for why, names in by_reason.items()) or "none"
            sys.stdout.write(
                f"[raydist] gradient clustering over {len(self.gc.layers)} layers; excluded: {skipped}\n"
            )
            if g.sample and not self.task.per_example_losses:
                sys.stdout.write(
                    "[raydist] note: gc.sample with a loss that is not a sum of per-example terms: "
                    "the weights scale each row's gradient contribution, a heuristic without the "
                    "unbiasedness guarantee\n"
                )

    def _statistics_step(self, ctx: StepContext) -> bool:
        """Whether this training step feeds GC's statistics: never under ``gc.sample`` (the reassignment
        passes do), else every ``gc.stats_every``-th global step (the same steps on every worker, so the
        U-steps' all-reduces line up, and the same after a resume)."""
        return not self.cfg.gc.sample and ctx.global_step % self.cfg.gc.stats_every == 0

    def forward_context(self, ctx: StepContext) -> AbstractContextManager[Any]:
        return self.gc.capture() if self._statistics_step(ctx) else nullcontext()

    def after_backward(self, ctx: StepContext, model: nn.Module) -> None:
        if self.cfg.gc.sample:
            return
        if self._statistics_step(ctx):
            batch = ctx.batch
            self.gc.after_backward(
                batch["sample_id"].cpu(), loss_scale=self.task.row_loss_scale(len(batch["sample_id"]))
            )
        if self.rank == 0 and ctx.global_step % self.cfg.gc.log_every == 0:
            self._measure(ctx)

    def wrap_batches(self, epoch: int, batches: Iterable[Batch]) -> Iterable[Batch]:
        if not self.cfg.gc.sample:
            return batches
        return self._stratified(epoch)

    def end_of_epoch(self, ctx: StepContext, model: nn.Module, metrics: dict[str, Any]) -> None:
        every = self.cfg.gc.reassign_every
        if every and (ctx.epoch + 1) % every == 0:
            self._reassign(ctx)
        if self.cfg.gc.sample and self.rank == 0:
            self._measure(ctx)
        metrics["gc/distortion"] = float(self.gc.total_distortion)
        if self.measurements:
            for key in self.measurements[0]:
                metrics[key] = float(np.mean([m[key] for m in self.measurements]))
            self.measurements = []

    def _stratified(self, epoch: int) -> Iterator[Batch]:
        """One epoch of stratified batches over the shard (clusters from the last reassignment)."""
        strata = self.gc.assignments(self.shard_ids) if self.gc.centres else torch.zeros_like(self.shard_ids)
        sampler = StratifiedSampler(strata, self.rows, seed=self.cfg.train.seed, dtype=torch.float32)
        sampler.set_epoch(epoch)
        for draw in sampler:
            idx = draw.indices.numpy()
            yield {**{k: v[idx] for k, v in self.shard.items()}, "weight": draw.weights.numpy()}

    def _reassign(self, ctx: StepContext) -> None:
        """A full pass over the shard without a parameter update: statistics and assignments of every row
        (every worker runs the same number of chunks, so the U-step all-reduces line up). Each chunk's loss is
        :meth:`Task.local_loss` (the chunk as a batch of its own), backpropagated as in training."""
        model = self.model
        params = [p for p in model.parameters() if p.requires_grad]
        scale = self.task.row_loss_scale(self.rows)
        for start in range(0, len(self.shard_ids) - self.rows + 1, self.rows):
            chunk = to_tensors({k: v[start : start + self.rows] for k, v in self.shard.items()}, self.device)
            with self.gc.capture():
                loss = self.task.local_loss(model, chunk, ctx)
            # autograd.grad drives the backward (the layer hooks see every output gradient) without
            # accumulating into .grad, so neither the optimizer nor DDP's gradient hooks see this pass
            torch.autograd.grad(loss, params, allow_unused=True)
            self.gc.after_backward(chunk["sample_id"].cpu(), loss_scale=scale)
        if self.cfg.gc.mode == "batch":
            self.gc.update()

    def _measure(self, ctx: StepContext) -> None:
        """SGD vs GC variance of this worker's mini-batch gradients (rank 0; training untouched); the estimates
        are gradients of :meth:`Task.local_loss` with the sampler's row weights."""
        if not self.gc.centres:
            return

        def estimate(model: nn.Module, batch: dict[str, Tensor], weights: Tensor) -> Tensor:
            tensors = {k: v.to(self.device) for k, v in batch.items()}
            return self.task.local_loss(model, tensors, ctx, row_weights=weights.to(self.device))

        self.measurements.append(
            measure_gradient_variance(
                self.model,
                estimate,
                ShardRows(self.shard),
                self.gc,
                batch_size=self.rows,
                num_batches=self.cfg.gc.variance_batches,
                generator=self.meter_generator,
                sample_ids=self.shard_ids,
            )
        )
