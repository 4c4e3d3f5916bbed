"""Sum-all-reduce over the default process group, for statistics that every worker must hold identically.

Without an initialised process group (one worker) it is the identity. Under NCCL, which reduces only CUDA
tensors, a CPU tensor makes a round trip through the current CUDA device, so callers need not care.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from raydist.distributed.gather import world_size


def all_reduce_sum(t: Tensor) -> Tensor:
    """In place ``t ← Σ_r t_r`` over all ranks r of the default group; returns ``t`` (the same object).

    Every rank must call it with a tensor of the same shape and dtype, in the same order. No autograd.
    """
    if world_size() > 1:
        if t.device.type == "cpu" and dist.get_backend() == "nccl":
            on_device = t.to(torch.device("cuda", torch.cuda.current_device()))
            dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
            t.copy_(on_device)
        else:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t
