"""The loss memory (``loss.memory_size``): a queue of the last N rows of past global batches, extra negatives for
the losses that read it (docs/algorithms.md#loss-memory).

Each training step pushes its gathered global batch (the keys of every rank, in rank order; embeddings at full
width and their ids or labels), detached, after the step's loss: every rank pushes the same rows, so every
rank holds the same queue. The next steps score their queries against the queue's rows too; gradients reach
only the current batch. A Matryoshka run slices and re-normalises each prefix of the stored rows as it does the
batch's. The queue is checkpoint state (tensors and plain numbers), so a resumed run continues with the same
queue, also on another number of workers (the rows are global).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor


class EmbeddingMemory:
    """A first-in first-out queue of ``size`` rows: one tensor per name (``[size, ...]``, allocated at the first
    push with that batch's dtypes and device), the ``filled`` rows and where the next row goes (``head``).
    :meth:`rows` gives them oldest first."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"memory size {size}: must be >= 1")
        self.size, self.filled, self.head = size, 0, 0
        self.buffers: dict[str, Tensor] = {}

    @torch.no_grad()
    def push(self, rows: Mapping[str, Tensor]) -> None:
        """Add a batch's rows (every tensor ``[B, ...]``, detached), dropping the oldest beyond ``size``."""
        count = next(iter(rows.values())).shape[0]
        if not self.buffers:
            self.buffers = {k: v.new_zeros((self.size, *v.shape[1:])) for k, v in rows.items()}
        device = next(iter(rows.values())).device
        self.buffers = {
            k: v.to(device) for k, v in self.buffers.items()
        }  # a restored queue: onto the batch's
        keep = min(count, self.size)
        slots = (self.head + torch.arange(keep)) % self.size
        for name, buffer in self.buffers.items():
            buffer[slots.to(buffer.device)] = rows[name].detach()[count - keep :].to(buffer.dtype)
        self.head = (self.head + keep) % self.size
        self.filled = min(self.filled + keep, self.size)

    def rows(self, device: torch.device | str | None = None) -> dict[str, Tensor] | None:
        """The queue's rows, oldest first (new tensors, no graph; on ``device`` when given); None while empty."""
        if not self.filled:
            return None
        order = (self.head - self.filled + torch.arange(self.filled)) % self.size
        return {name: buffer[order.to(buffer.device)].to(device) for name, buffer in self.buffers.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"size": self.size, "filled": self.filled, "head": self.head, "rows": dict(self.buffers)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (the rows move to the batches' device at the next push)."""
        if state["size"] != self.size:
            raise ValueError(f"the checkpoint's loss memory holds {state['size']} rows, this run {self.size}")
        self.filled, self.head = int(state["filled"]), int(state["head"])
        self.buffers = {k: v.clone() for k, v in state["rows"].items()}


class MinedNegatives:
    """The negatives mined from the train split for each of its samples (``loss.mined_negatives``): ``rows``, every
    train row as the mining pass embedded it (full width, detached) with its ids (``sample_id`` among them),
    ``table`` ``[N, K]`` the mined row numbers of row r's sample (−1: fewer), and the global ``step`` they were
    mined at. :meth:`rows_of` gives a batch's mined rows as extra keys."""

    def __init__(self, rows: Mapping[str, Tensor], table: Tensor, step: int) -> None:
        self.rows, self.table, self.step = dict(rows), table, step
        self.order = torch.argsort(self.rows["sample_id"])  # row numbers by sample id (lookups)

    def rows_of(self, sample_ids: Tensor) -> dict[str, Tensor] | None:
        """The distinct rows mined for ``sample_ids`` (the step's global batch), those of the batch itself left
        out (they are keys already), in row order; None: none."""
        ids = self.rows["sample_id"]
        wanted = sample_ids.to(ids.device)
        found = self.order[torch.searchsorted(ids[self.order], wanted).clamp(max=len(ids) - 1)]
        mined = self.table[found[ids[found] == wanted]].flatten()
        mined = torch.unique(mined[mined >= 0])
        mined = mined[~torch.isin(ids[mined], wanted)]
        if not mined.numel():
            return None
        return {k: v[mined].to(sample_ids.device) for k, v in self.rows.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"rows": dict(self.rows), "table": self.table, "step": self.step}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> MinedNegatives:
        return cls(state["rows"], state["table"], int(state["step"]))
