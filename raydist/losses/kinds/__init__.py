"""Loss kinds and miners as registered components (``loss.kind``, ``loss.miner``): the registries and the
base class (:mod:`raydist.losses.kinds.base`) and the shipped kinds, one module each: ranking (pairs),
cross_entropy, triplet and margin (labels)."""

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
