"""Loss kinds as registered components (``loss.kind``): the torch-free declaration base
(:mod:`raydist.losses.kinds.base`) and the shipped kinds, one module each: ranking (pairs), cross_entropy, and
triplet_losses (triplet and margin; labels). The config finds every module of this package by its name (the
one loss-kind registry, :data:`raydist.config.LOSS_KINDS`), so a new shipped loss kind is one module here
(+ its test); a plugin registers one the same way from anywhere. The modules import no torch: a kind imports its
maths where it computes (:mod:`raydist.losses.cross_worker_ranking`, :mod:`raydist.losses.cross_worker_metric`).
"""

# first the config: its registry imports this package's modules, which register into it
from raydist.config import LOSS_KINDS
from raydist.losses.kinds.base import (
    LOSSES,
    LossKind,
    MinedOptions,
    NoOptions,
    get_loss,
    register_loss,
    task_losses,
)
from raydist.losses.kinds.cross_entropy import CrossEntropyLoss, head_cross_entropy
from raydist.losses.kinds.ranking import RankingLoss, RankingOptions
from raydist.losses.kinds.triplet_losses import (
    MarginLoss,
    MarginOptions,
    MetricOptions,
    MinedLoss,
    TripletLoss,
    TripletOptions,
)

__all__ = [
    "LOSSES",
    "LOSS_KINDS",
    "CrossEntropyLoss",
    "LossKind",
    "MarginLoss",
    "MarginOptions",
    "MetricOptions",
    "MinedLoss",
    "MinedOptions",
    "NoOptions",
    "RankingLoss",
    "RankingOptions",
    "TripletLoss",
    "TripletOptions",
    "get_loss",
    "head_cross_entropy",
    "register_loss",
    "task_losses",
]
