"""``loss.kind=triplet`` and ``loss.kind=margin`` (task labels): metric-learning losses mined over the global
batch of all workers, exact under DDP; the shipped miners (``loss.miner``).

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

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from raydist.choices import MINER_STRATEGIES
from raydist.config import MarginOptions, TripletOptions
from raydist.distributed import GatheredBatch, gather_step
from raydist.losses.kinds.base import (
    MINERS,
    LossInputs,
    LossKind,
    Miner,
    register_loss,
    register_miner,
    world_mean,
)
from raydist.losses.margin import MarginBeta, margin_loss_parts
from raydist.losses.noise import sampler_skew
from raydist.losses.reducers import scale_for_world
from raydist.losses.triplets import (
    RANDOM_STRATEGIES,
    TermSum,
    Triplets,
    check_labels,
    mine_triplets,
    negative_probabilities,
    reduce_terms,
    triplet_terms,
)

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


for _strategy in MINER_STRATEGIES:  # the shipped miners (raydist.losses.triplets.mine_triplets)
    register_miner(
        _strategy,
        Miner(
            partial(mine_triplets, strategy=_strategy, normalize=False),
            random=_strategy in RANDOM_STRATEGIES,
            probabilities=partial(negative_probabilities, strategy=_strategy, normalize=False),
        ),
    )


def mining_stats(
    emb: Tensor, labels: Tensor, triplets: Triplets, *, miner: Miner, margin: float, distance: str
) -> dict[str, float]:
    """Per-step mining statistics: ``noise/eta_neg`` — the sampler skew η₋ of the drawn negatives against
    uniform 1-1 sampling (:func:`raydist.losses.noise.sampler_skew`: mean over triplets of the number of
    candidate negatives of the anchor times the probability the miner gave the drawn one; only for a miner
    that gives its probabilities) — and ``noise/triplets``, the triplets mined for this rank's anchors."""
    if triplets.anchors.numel() == 0:
        return {"noise/triplets": 0.0}
    stats = {}
    if miner.probabilities is not None:
        probs = miner.probabilities(emb, labels, *triplets, margin=margin, distance=distance)
        candidates = (labels.unsqueeze(0) != labels[triplets.anchors].unsqueeze(1)).sum(1)
        stats["noise/eta_neg"] = sampler_skew(probs.cpu(), candidates.cpu())
    return {**stats, "noise/triplets": float(triplets.anchors.numel())}


class MinedLoss(LossKind):
    """A loss on triplets mined by ``loss.miner`` over the global batch (:func:`rank_metric_loss`); subclasses
    give :meth:`parts`, the :class:`TermSum` of given triplets. The rows are unit already (the model's output,
    or a re-normalised prefix): mined as they are."""

    task = "labels"

    def parts(self, emb: Tensor, labels: Tensor, triplets: Triplets, inputs: LossInputs) -> TermSum:
        """The loss of ``triplets`` of the global batch before its division."""
        raise NotImplementedError

    def loss(self, inputs: LossInputs) -> Tensor:
        o, miner = self.options, MINERS.get(self.options.miner)

        def observe(emb: Tensor, labels: Tensor, triplets: Triplets) -> None:
            inputs.stats.update(
                mining_stats(emb, labels, triplets, miner=miner, margin=o.margin, distance=o.distance)
            )

        return rank_metric_loss(
            inputs.batch,
            emb="emb",
            labels="label",
            miner=partial(miner.mine, margin=o.margin, distance=o.distance),
            loss_parts=lambda emb, labels, triplets: self.parts(emb, labels, triplets, inputs),
            generator=self.generator(inputs) if miner.random else None,
            observe=observe if inputs.stats is not None else None,
        )


@register_loss
class TripletLoss(MinedLoss):
    """Triplet loss ``[d_ap − d_an + α]₊`` (or unhinged), averaged over the mined triplets."""

    name = "triplet"
    Options = TripletOptions

    def parts(self, emb: Tensor, labels: Tensor, triplets: Triplets, inputs: LossInputs) -> TermSum:
        o = self.options
        terms = triplet_terms(emb, triplets, margin=o.margin, hinged=o.hinged, distance=o.distance)
        return reduce_terms(terms, "mean")


@register_loss
class MarginLoss(MinedLoss):
    """Margin loss with a learnable boundary β (one, or one per class with ``loss.beta_per_class``), averaged
    over the non-zero pair terms."""

    name = "margin"
    Options = MarginOptions
    module_name = "beta"  # the model's ``beta`` (checkpoints keep their ``beta.beta`` key)

    def module(self, num_classes: int | None) -> nn.Module:
        o = self.options
        return MarginBeta(num_classes if o.beta_per_class else None, init=o.beta)

    def parts(self, emb: Tensor, labels: Tensor, triplets: Triplets, inputs: LossInputs) -> Any:
        o = self.options
        beta = inputs.extras["beta"]
        return margin_loss_parts(
            emb, labels, triplets, beta=beta, alpha=o.margin, nu=o.nu, distance=o.distance
        )
