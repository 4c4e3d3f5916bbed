"""Loss kinds and miners as registered components (``loss.kind``, ``loss.miner``): the registries and the
base class (:mod:`raydist.losses.kinds.base`) and the shipped kinds, one module each: ranking (pairs),
cross_entropy, triplet and margin (labels). Every module of this package is imported with it
(:func:`discover_loss_modules`), so a new shipped loss kind is one module here (+ its test); a plugin registers
one the same way from anywhere."""

import importlib
import pkgutil

from raydist.losses.kinds.base import (
    LOSSES,
    MINERS,
    LossInputs,
    LossKind,
    Miner,
    get_loss,
    nested_rank_loss,
    register_loss,
    register_miner,
    task_losses,
    world_mean,
)
from raydist.losses.kinds.cross_entropy import CrossEntropyLoss, head_cross_entropy
from raydist.losses.kinds.metric import (
    MarginLoss,
    MinedLoss,
    TripletLoss,
    cross_worker_metric_loss,
    mining_stats,
    rank_metric_loss,
)
from raydist.losses.kinds.ranking import (
    RankingLoss,
    cross_worker_ranking_loss,
    negative_set_stats,
    rank_ranking_loss,
    ranking_ids,
    step_ranking_loss,
)

__all__ = [
    "LOSSES",
    "MINERS",
    "CrossEntropyLoss",
    "LossInputs",
    "LossKind",
    "MarginLoss",
    "MinedLoss",
    "Miner",
    "RankingLoss",
    "TripletLoss",
    "cross_worker_metric_loss",
    "cross_worker_ranking_loss",
    "discover_loss_modules",
    "get_loss",
    "head_cross_entropy",
    "mining_stats",
    "negative_set_stats",
    "nested_rank_loss",
    "rank_metric_loss",
    "rank_ranking_loss",
    "ranking_ids",
    "register_loss",
    "register_miner",
    "step_ranking_loss",
    "task_losses",
    "world_mean",
]


def discover_loss_modules() -> list[str]:
    """Import every module of this package (each registers its loss kinds and miners); return the loss kinds
    registered (a plugin's too, once it is loaded)."""
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    return LOSSES.names()


discover_loss_modules()
