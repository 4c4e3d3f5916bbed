"""raydist.distributed: the gather step (differentiable all-gather) and the step's negative-set plan (the
cross-worker losses on them are :mod:`raydist.losses.kinds`)."""

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
    rows_per_worker,
    sample_negative_set,
    step_generator,
)

__all__ = [
    "GatheredBatch",
    "NegativeSet",
    "StepPlan",
    "all_gather_tensor",
    "all_gather_with_grad",
    "gather_step",
    "global_rank",
    "rows_per_worker",
    "sample_negative_set",
    "step_generator",
    "world_size",
]
