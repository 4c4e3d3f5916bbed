"""``loss.kind=triplet`` and ``loss.kind=margin`` (task labels): losses on triplets mined over the global batch of
all workers by the miner ``loss.miner`` names. Their options are torch-free; the loss is
:func:`raydist.losses.cross_worker_metric.rank_metric_loss` (imported with torch when the loss is computed)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from raydist.losses.kinds.base import LossKind, MemoryOptions, MinedOptions, MiningOptions, register_loss

if TYPE_CHECKING:
    from torch import Tensor, nn

    from raydist.config import Config
    from raydist.losses.inputs import LossInputs
    from raydist.losses.miners import Triplets
    from raydist.losses.reducers import TermSum


class MetricOptions(MinedOptions, MemoryOptions, MiningOptions):
    """The mining options of the triplet and margin losses (task labels)."""

    miner: str = "semihard-random"  # a registered miner (raydist.losses.miners)
    distance: str = "euclidean"  # a registered distance (raydist.losses.distances)


class TripletOptions(MetricOptions):
    """``loss.kind=triplet`` (task labels)."""

    hinged: bool = True  # triplet: [d_ap − d_an + α]₊ (true) or d_ap − d_an (false)


class MarginOptions(MetricOptions):
    """``loss.kind=margin`` (task labels): Wu et al.'s margin loss with a learnable boundary β."""

    beta: float = 1.2  # margin loss: initial boundary β₀ (learnable)
    beta_per_class: bool = False  # margin loss: one β per class
    nu: float = Field(0.0, ge=0)  # margin loss: ν·β regularisation


class MinedLoss(LossKind):
    """A loss on triplets mined by ``loss.miner`` over the global batch (:func:`rank_metric_loss`); subclasses
    give :meth:`parts`, the :class:`TermSum` of given triplets. The rows are unit already (the model's output,
    or a re-normalised prefix): mined as they are. Built (on the driver first, before Ray starts) with its miner and
    distance objects: a name no miner or distance is registered under is a ConfigError naming the key."""

    task = "labels"

    def __init__(self, cfg: Config) -> None:
        from raydist.losses.components import registered
        from raydist.losses.distances import DISTANCES
        from raydist.losses.miners import MINERS

        super().__init__(cfg)
        o = self.options
        self.distance = registered(DISTANCES, "loss.distance", o.distance)()
        self.miner = registered(MINERS, "loss.miner", o.miner)(
            margin=o.margin, distance=self.distance, normalize=False
        )

    def parts(self, emb: Tensor, labels: Tensor, triplets: Triplets, inputs: LossInputs) -> TermSum:
        """The loss of ``triplets`` of the global batch before its division."""
        raise NotImplementedError

    def loss(self, inputs: LossInputs) -> Tensor:
        from raydist.losses.cross_worker_metric import mining_stats, rank_metric_loss

        miner = self.miner

        def observe(emb: Tensor, labels: Tensor, triplets: Triplets) -> None:
            inputs.stats.update(mining_stats(emb, labels, triplets, miner=miner))

        loss = rank_metric_loss(
            inputs.batch,
            emb="emb",
            labels="label",
            miner=miner,
            loss_parts=lambda emb, labels, triplets: self.parts(emb, labels, triplets, inputs),
            generator=self.generator(inputs) if miner.random else None,
            observe=observe if inputs.stats is not None else None,
            memory=self.extra_keys(inputs),
        )
        self.remember(inputs)
        return loss


@register_loss
class TripletLoss(MinedLoss):
    """Triplet loss ``[d_ap − d_an + α]₊`` (or unhinged), averaged over the mined triplets."""

    name = "triplet"
    Options = TripletOptions

    def parts(self, emb: Tensor, labels: Tensor, triplets: Triplets, inputs: LossInputs) -> TermSum:
        from raydist.losses.reducers import reduce_terms
        from raydist.losses.triplets import triplet_terms

        o = self.options
        terms = triplet_terms(emb, triplets, margin=o.margin, hinged=o.hinged, distance=self.distance)
        return reduce_terms(terms, "mean")


@register_loss
class MarginLoss(MinedLoss):
    """Margin loss with a learnable boundary β (one, or one per class with ``loss.beta_per_class``), averaged
    over the non-zero pair terms."""

    name = "margin"
    Options = MarginOptions
    module_name = "beta"  # the model's ``beta`` (checkpoints keep their ``beta.beta`` key)

    def module(self, num_classes: int | None) -> nn.Module:
        from raydist.losses.margin import MarginBeta

        o = self.options
        return MarginBeta(num_classes if o.beta_per_class else None, init=o.beta)

    def parts(self, emb: Tensor, labels: Tensor, triplets: Triplets, inputs: LossInputs) -> Any:
        from raydist.losses.margin import margin_loss_parts

        o = self.options
        beta = inputs.extras["beta"]
        return margin_loss_parts(
            emb, labels, triplets, beta=beta, alpha=o.margin, nu=o.nu, distance=self.distance
        )
