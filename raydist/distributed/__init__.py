"""raydist.distributed: the gather step (differentiable all-gather) and the step's negative-set plan."""

from raydist.distributed.gather import (
    GatheredBatch,
    all_gather_tensor,
    all_gather_with_grad,
    gather_step,
    global_rank,
    world_size,
)
from raydist.distributed.negatives import (
    NegativeSet,
    StepPlan,
    cross_worker_ranking_loss,
    negative_set_stats,
    rank_ranking_loss,
    ranking_ids,
    rows_per_worker,
    sample_negative_set,
    step_generator,
    step_ranking_loss,
)

__all__ = [
    "GatheredBatch",
    "NegativeSet",
    "StepPlan",
    "all_gather_tensor",
    "all_gather_with_grad",
    "cross_worker_ranking_loss",
    "gather_step",
    "global_rank",
    "negative_set_stats",
    "rank_ranking_loss",
    "ranking_ids",
    "rows_per_worker",
    "sample_negative_set",
    "step_generator",
    "step_ranking_loss",
    "world_size",
]
