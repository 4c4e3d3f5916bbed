"""The cross-worker metric loss: metric-learning losses mined over the global batch of all workers, exact under
DDP -- what ``loss.kind=triplet`` and ``loss.kind=margin`` compute (:mod:`raydist.losses.kinds.triplet_losses`),
with the miner ``loss.miner`` names (:mod:`raydist.losses.miners`).

The loss kinds call :func:`rank_metric_loss` on the task's gathered batch; :func:`cross_worker_metric_loss` is
the public one-call entry point for a DDP loop of one's own. Each of the W ranks passes its own m rows (the same m
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
:func:`raydist.losses.reducers.scale_for_world`, the one place it happens (through :func:`world_mean`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from raydist.distributed import GatheredBatch, gather_step
from raydist.losses.inputs import world_mean
from raydist.losses.miners import TripletMiner, Triplets, check_labels
from raydist.losses.reducers import TermSum, scale_for_world

MineFn = Callable[..., Triplets]
LossParts = Callable[[Tensor, Tensor, Triplets], TermSum]


def rank_metric_loss(
    batch: GatheredBatch,
    *,
    emb: str,
    labels: str,
    miner: MineFn,
    loss_parts: LossParts,
    generator: torch.Generator | None = None,
    observe: Callable[[Tensor, Tensor, Triplets], None] | None = None,
    memory: Mapping[str, Tensor] | None = None,
) -> Tensor:
    """This rank's share of a metric loss on a gathered batch (embeddings ``emb``, labels ``labels``):
    mining over the global batch, the triplets whose anchor this rank owns, the global denominator and ×W
    (module docstring). ``observe(global_emb, global_labels, own_triplets)`` sees the mined triplets
    (statistics such as the sampler skew). ``memory``: the loss memory's rows (``emb``, ``labels``; no graph),
    mined after the global batch's rows; anchors stay this step's rows (docs/algorithms.md#loss-memory)."""
    global_emb, global_labels = batch.keys[emb], check_labels(batch.keys[emb], batch.keys[labels])
    rows = global_emb.shape[0]
    if memory is not None:
        global_emb = torch.cat([global_emb, memory[emb]])
        global_labels = torch.cat([global_labels, memory[labels].to(global_labels)])
    triplets = miner(global_emb.detach(), global_labels, generator=generator)
    anchors = triplets.anchors.clamp(max=rows - 1)
    own = (triplets.anchors < rows) & (batch.key_positions[anchors] // batch.rows == batch.rank)
    mine = Triplets(*(index[own] for index in triplets))
    if observe is not None:
        observe(global_emb.detach(), global_labels, mine)
    parts = loss_parts(global_emb, global_labels, mine)
    if parts.count is None:
        return scale_for_world(parts.total, batch.world)
    return world_mean(parts.total, parts.count, batch)  # a one-rank batch (Task.local_loss): no collective


def cross_worker_metric_loss(
    emb: Tensor,
    labels: Tensor,
    *,
    miner: MineFn,
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


def mining_stats(emb: Tensor, labels: Tensor, triplets: Triplets, *, miner: TripletMiner) -> dict[str, float]:
    """Per-step mining statistics: ``noise/eta_neg`` — the miner's sampler skew η₋ of the drawn negatives
    against uniform 1-1 sampling (:meth:`raydist.losses.miners.TripletMiner.skew`; only for a miner that gives
    its probabilities) — and ``noise/triplets``, the triplets mined for this rank's anchors."""
    eta = miner.skew(emb, labels, triplets)
    stats = {} if eta is None else {"noise/eta_neg": eta}
    return {**stats, "noise/triplets": float(triplets.anchors.numel())}
