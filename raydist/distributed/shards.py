"""A split's evaluation batches shared out over the ranks: inside :func:`sharded_batches`, rank r of W embeds
batches r, r + W, r + 2W, … and one all-gather puts every batch back in its place, so each rank ends up with
the rows one process would have computed, batch for batch."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from raydist.distributed.gather import all_gather_tensor, global_rank, world_size

_SHARDED = contextvars.ContextVar("raydist_sharded_batches", default=False)
MAX_PARTS = 8  # tensors one batch may map to (map_batches)


@contextmanager
def sharded_batches() -> Iterator[None]:
    """Within this context :func:`map_batches` shares its batches out over the ranks of the default process
    group (every rank must then make the same calls, in the same order, with the same row counts)."""
    token = _SHARDED.set(True)
    try:
        yield
    finally:
        _SHARDED.reset(token)


def batch_starts(rows: int, batch_size: int, rank: int, world: int) -> range:
    """First rows of the batches rank ``rank`` of ``world`` embeds: batch b (rows ``[b·bs, (b+1)·bs) ∩ [0,
    rows)``) goes to rank ``b mod world``."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: expected >= 1")
    return range(rank * batch_size, rows, world * batch_size)


def rows_of_rank(rows: int, batch_size: int, rank: int, world: int) -> np.ndarray:
    """The row numbers rank ``rank`` embeds, in the order it embeds them (:func:`batch_starts`)."""
    starts = batch_starts(rows, batch_size, rank, world)
    if not starts:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(s, min(s + batch_size, rows)) for s in starts])


def map_batches(
    fn: Callable[[int, int], Tensor | tuple[Tensor, ...]], rows: int, batch_size: int
) -> Tensor | tuple[Tensor, ...]:
    """``cat([fn(s, min(s + batch_size, rows)) for s in range(0, rows, batch_size)])``: ``fn`` maps a batch's
    row range to [rows in it, D] (on the CPU), or to a tuple of such tensors (each concatenated on its own).
    Inside :func:`sharded_batches` with W > 1 ranks each rank runs only its own batches (:func:`batch_starts`)
    and one all-gather brings the others: every rank returns the same rows, each batch computed from the same
    rows as in one process. No row is dropped or repeated when ``rows`` does not divide by W or by
    ``batch_size``."""
    world = world_size()
    if not _SHARDED.get() or world == 1:
        return _joined([fn(s, min(s + batch_size, rows)) for s in range(0, rows, batch_size)])
    rank = global_rank()
    mine = _joined([fn(s, min(s + batch_size, rows)) for s in batch_starts(rows, batch_size, rank, world)])
    parts = None if mine is None else (mine if isinstance(mine, tuple) else (mine,))
    if parts is not None and len(parts) > MAX_PARTS:
        raise ValueError(f"map_batches: at most {MAX_PARTS} tensors per batch, got {len(parts)}")
    # what a rank without a batch cannot know: [is a tuple, parts, their widths] of a rank that has one
    shape = torch.zeros(1, 2 + MAX_PARTS, dtype=torch.int64)
    if parts is not None:
        shape[0, : 2 + len(parts)] = torch.tensor(
            [isinstance(mine, tuple), len(parts), *(p.shape[1] for p in parts)]
        )
    known = _gathered(shape)
    known = known[int(torch.argmax(known[:, 1]))]
    widths = known[2 : 2 + int(known[1])].tolist()
    dtype = parts[0].dtype if parts is not None else torch.float32
    # rank 0 holds the most rows (the first batch of every round); the others are padded to its count
    most = len(rows_of_rank(rows, batch_size, 0, world))
    padded = torch.zeros(most, sum(widths), dtype=dtype)
    if parts is not None:
        local = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        padded[: len(local)] = local
    gathered = _gathered(padded)
    out = torch.empty(rows, sum(widths), dtype=dtype)
    for r in range(world):
        rows_r = torch.as_tensor(rows_of_rank(rows, batch_size, r, world))
        out[rows_r] = gathered[r * most : r * most + len(rows_r)]
    split = tuple(part.contiguous() for part in out.split(widths, dim=1))
    return split if bool(known[0]) else split[0]


def _joined(batches: list) -> Tensor | tuple[Tensor, ...] | None:
    """Batches' outputs concatenated by rows (tuples part by part); None for no batches."""
    if not batches:
        return None
    if isinstance(batches[0], tuple):
        return tuple(torch.cat(parts) for parts in zip(*batches, strict=True))
    return torch.cat(batches)


def _gathered(x: Tensor) -> Tensor:
    """All-gather of a CPU tensor (through the current CUDA device under NCCL, which gathers only CUDA
    tensors), back on the CPU."""
    if dist.get_backend() == "nccl":
        return all_gather_tensor(x.to(torch.device("cuda", torch.cuda.current_device()))).cpu()
    return all_gather_tensor(x)
