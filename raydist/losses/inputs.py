"""What a loss kind computes this rank's loss from (:class:`LossInputs`: the step's gathered batch, negative set and
extras for one Matryoshka prefix view), this rank's share of a global mean (:func:`world_mean`) and the
Matryoshka sum of a kind's loss over the prefix views (:func:`nested_rank_loss`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from raydist.distributed import GatheredBatch, NegativeSet, all_gather_tensor
from raydist.losses.nested import Prefix, nested_sum
from raydist.losses.reducers import scale_for_world

NO_NESTING = Prefix(None)  # the view of a run without model.nesting: the whole embedding


@dataclass(frozen=True)
class LossInputs:
    """What a loss kind computes this rank's loss from, for one Matryoshka prefix view.

    ``batch``: the step's gathered batch (:class:`raydist.distributed.GatheredBatch`): ``batch.local`` this
    rank's rows, ``batch.keys`` the global batch of all workers (rank-major; embeddings with autograd, ids
    without; just the local rows when the kind does not gather or ``loss.gather=false``), ``batch.positions``
    / ``batch.key_positions`` their global row numbers. Embeddings are this view's prefix, re-normalised.
    Task pairs: ``img``, ``cap`` embeddings, ``image_id``, ``sample_id`` ids; task labels: ``emb``, ``label``,
    ``sample_id``. ``negative_set``: the step's query rows and key subset (``loss.negative_set_size``).
    ``extras``: the encoder's other outputs for this view (labels: ``logits`` of the head) and the kind's
    learnable parameters (:meth:`raydist.losses.LossKind.extras`). ``stats``: where to put per-step statistics (None on all
    but the largest prefix). ``view``: the prefix (:class:`raydist.losses.nested.Prefix`). ``step_batch``: the
    gathered batch at full width, of which ``batch`` is the view (what the loss memory stores).
    """

    batch: GatheredBatch
    negative_set: NegativeSet
    extras: Mapping[str, Any]
    epoch: int
    global_step: int
    stats: dict[str, float] | None
    view: Prefix = NO_NESTING
    step_batch: GatheredBatch | None = None  # the gathered batch at full width (``batch`` is the view's)


def world_mean(total: Tensor, count: Tensor | float, batch: GatheredBatch) -> Tensor:
    """This rank's share of a global mean: ``W · total_r / Σ_r count_r`` (one all-gather of the counts; none for
    a one-rank batch). ``total`` sums this rank's terms, ``count`` counts them; with every rank returning this,
    DDP's average of the gradients is the gradient of ``Σ_r total_r / Σ_r count_r`` and the mean of the
    returned values is that loss. Nothing counted anywhere: a graph-connected 0."""
    count = torch.as_tensor(count, device=total.device).reshape(1)
    if batch.world > 1:
        count = all_gather_tensor(count)
    return scale_for_world(total / count.sum().clamp(min=1), batch.world)


def nested_rank_loss(
    loss: Callable[[LossInputs], Tensor],
    inputs: LossInputs,
    embeddings: Sequence[str],
    dims: Sequence[int] | None,
    weights: Sequence[float] | None = None,
) -> Tensor:
    """The Matryoshka loss ``Σ_m c_m · loss(inputs at prefix m)`` (:func:`nested_sum`; ``model.nesting``,
    ``loss.nesting_weights``): the ``embeddings`` of the gathered batch as the prefix view (one gather serves
    every prefix), per-dim list extras (a nested head's logits) at the prefix's entry, statistics only from
    the largest prefix. Without nesting, ``loss(inputs)``."""

    def at(view: Prefix) -> Tensor:
        extras = {k: view.pick(v) if isinstance(v, list) else v for k, v in inputs.extras.items()}
        stats = inputs.stats if view.largest else None
        batch = inputs.batch.view(view, embeddings)
        full = inputs.step_batch or inputs.batch
        return loss(replace(inputs, batch=batch, extras=extras, stats=stats, view=view, step_batch=full))

    return nested_sum(at, dims, weights)
