"""Cross-worker metric-learning losses (triplet, margin) mined over the global batch, exact under DDP.

The labels task calls :func:`rank_metric_loss` on its gathered batch; :func:`cross_worker_metric_loss` is the
public one-call entry point for a DDP loop of one's own. Each of the W ranks passes its own m rows (the same m
everywhere); global row ``r·m + i`` is local row i of rank r (the order of :func:`all_gather_with_grad`).
Embeddings are gathered with autograd, labels without. The miner sees the rows as gathered: callers whose rows
are unit already pass ``normalize=False`` to :func:`raydist.losses.mine_triplets`.

Mining. Every rank mines the same global W·m batch with the same miner and a generator seeded identically on
every rank, so every rank holds the same global triplets (the single-process triplets of the concatenated
batch, random draws included). Rank r keeps the triplets whose anchor is one of its rows.

Scaling. Rank r returns ``W · total_r / count`` (``W · total_r`` for "sum"), where ``total_r`` sums the
terms of its triplets and ``count`` is the global denominator: the sum over ranks of the per-rank counts.
Each global triplet is on exactly one rank (its anchor's owner), so ``Σ_r total_r`` and ``count`` are the
single-process total and count (e.g. of non-zero terms), and ``L = Σ_r total_r / count`` is the
single-process loss. The gather's backward sums every rank's gradient with respect to the rows it gathered
back to their owner, so rank r's rows receive ``W · ∂L/∂x``; DDP then divides by W. A parameter of the
loss (margin β, a DDP parameter too) receives ``W · ∂(total_r / count)/∂β`` on rank r, whose mean over
ranks is ``∂L/∂β``. The mean over ranks of the returned values is L. The ×W is
:func:`raydist.losses.reducers.scale_for_world`, the one place it happens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from raydist.distributed.gather import GatheredBatch, all_gather_tensor, gather_step
from raydist.losses.reducers import scale_for_world
from raydist.losses.triplets import TermSum, Triplets, check_labels

Miner = Callable[..., Triplets]
LossParts = Callable[[Tensor, Tensor, Triplets], TermSum]


def rank_metric_loss(
    batch: GatheredBatch,
    *,
    emb: str,
    labels: str,
    miner: Miner,
    loss_parts: LossParts,
    generator: torch.Generator | None = None,
    observe: Callable[[Tensor, Tensor, Triplets], None] | None = None,
) -> Tensor:
    """This rank's share of a metric loss on a gathered batch (embeddings ``emb``, labels ``labels``):
    mining over the global batch, the triplets whose anchor this rank owns, the global denominator and ×W
    (module docstring). ``observe(global_emb, global_labels, own_triplets)`` sees the mined triplets
    (statistics such as the sampler skew)."""
    global_emb, global_labels = batch.keys[emb], check_labels(batch.keys[emb], batch.keys[labels])
    triplets = miner(global_emb.detach(), global_labels, generator=generator)
    own = batch.key_positions[triplets.anchors] // batch.rows == batch.rank
    mine = Triplets(*(index[own] for index in triplets))
    if observe is not None:
        observe(global_emb.detach(), global_labels, mine)
    parts = loss_parts(global_emb, global_labels, mine)
    if parts.count is None:
        return scale_for_world(parts.total, batch.world)
    # a batch of one rank (Task.local_loss) is its own global batch: no collective
    count = parts.count if batch.world == 1 else all_gather_tensor(parts.count.reshape(1)).sum()
    return scale_for_world(parts.value(count), batch.world)


def cross_worker_metric_loss(
    emb: Tensor,
    labels: Tensor,
    *,
    miner: Miner,
    loss_parts: LossParts,
    generator: torch.Generator | None = None,
) -> Tensor:
    """This rank's share of a metric loss over the global batch (module docstring: mining and scaling).

    ``miner(global_emb, global_labels, generator=generator)`` returns the global :class:`Triplets`, e.g.
    ``functools.partial(mine_triplets, strategy="semihard-random", margin=0.2)``; ``generator`` must be
    seeded identically on every rank for the random strategies. ``loss_parts(global_emb, global_labels,
    triplets)`` returns the :class:`TermSum` of the given triplets, e.g. :func:`margin_loss_parts` or
    ``reduce_terms(triplet_terms(emb, triplets, ...), reduction)``. With one process this is
    ``loss_parts(emb, labels, miner(emb, labels)).value()``.
    """
    labels = check_labels(emb, labels)
    batch = gather_step({"emb": emb}, {"labels": labels})
    return rank_metric_loss(
        batch, emb="emb", labels="labels", miner=miner, loss_parts=loss_parts, generator=generator
    )
