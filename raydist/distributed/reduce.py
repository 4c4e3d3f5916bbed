"""Sum-all-reduce over the default process group, for statistics that every worker must hold identically.

Without an initialised process group (one worker) it is the identity.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor

from raydist.distributed.gather import world_size


def all_reduce_sum(t: Tensor) -> Tensor:
    """In place ``t ← Σ_r t_r`` over all ranks r of the default group; returns ``t`` (the same object).

    Every rank must call it with a tensor of the same shape and dtype, in the same order. No autograd.
    """
    if world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t
