"""raydist.distributed: differentiable all-gather and the cross-worker negative set (DESIGN.md §3)."""

from raydist.distributed.gather import all_gather_tensor, all_gather_with_grad, global_rank, world_size
from raydist.distributed.negatives import (
    NegativeSet,
    cross_worker_ranking_loss,
    negative_set_stats,
    rows_per_worker,
    sample_negative_set,
    step_ranking_loss,
)

__all__ = [
    "NegativeSet",
    "all_gather_tensor",
    "all_gather_with_grad",
    "cross_worker_ranking_loss",
    "global_rank",
    "negative_set_stats",
    "rows_per_worker",
    "sample_negative_set",
    "step_ranking_loss",
    "world_size",
]
