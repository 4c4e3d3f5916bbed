"""All-gather across the default process group, with and without autograd, and the step's gather.

The only module that calls collectives; without an initialised process group everything is the identity.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as functional
from torch import Tensor


def world_size() -> int:
    """Ranks in the default process group; 1 when torch.distributed is not initialised."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def global_rank() -> int:
    """This process's rank in the default process group; 0 when not initialised."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def all_gather_with_grad(x: Tensor) -> Tensor:
    """``cat([x_0, …, x_{W−1}], dim=0)`` in rank order, differentiable.

    Every rank must pass a tensor of the same shape. Backward is a reduce-scatter with sum: the
    gradient this rank's ``x`` receives is ``Σ_r ∂L_r/∂out_r[rank slice]`` — the sum over all ranks r
    of the gradient of r's loss with respect to the rows r gathered from this rank. Hence if every rank
    backpropagates its own loss ``L_r``, each owner gets ``∂(Σ_r L_r)/∂x`` for its rows.
    Wraps ``torch.distributed._functional_collectives.all_gather_single`` (autograd, no deprecation
    warning on torch 2.13 gloo). Identity when the world size is 1.
    """
    if world_size() == 1:
        return x
    out = functional.all_gather_single(x.contiguous(), 0, dist.group.WORLD)
    return out.wait() if isinstance(out, functional.AsyncCollectiveTensor) else out


def all_gather_tensor(x: Tensor) -> Tensor:
    """Like :func:`all_gather_with_grad` but without autograd (for ids and statistics)."""
    return all_gather_with_grad(x.detach())


@dataclass
class GatheredBatch:
    """The gather step's output: this rank's rows and the global batch of all ranks (rank-major).

    ``keys[name]`` is the all-gather of ``local[name]`` — with autograd for embeddings, without for ids —
    or the local rows themselves when gathering is off. ``positions``/``key_positions`` are global row
    positions (rank r's local row i is ``r·rows + i``). Views of the same embeddings (e.g. nested prefixes)
    are sliced from here after the one gather.
    """

    local: dict[str, Tensor]
    keys: dict[str, Tensor]
    positions: Tensor
    key_positions: Tensor
    rank: int
    world: int

    @property
    def rows(self) -> int:
        """Rows each rank holds."""
        return int(self.positions.numel())

    def view(self, fn: Callable[[Tensor], Tensor], names: Sequence[str]) -> GatheredBatch:
        """The same batch with ``fn`` applied to the local and global rows of ``names`` (e.g. a nested
        prefix, re-normalised): views of one gather, no collective."""
        local = {**self.local, **{n: fn(self.local[n]) for n in names}}
        keys = {**self.keys, **{n: fn(self.keys[n]) for n in names}}
        return GatheredBatch(local, keys, self.positions, self.key_positions, self.rank, self.world)


def gather_step(
    embeddings: Mapping[str, Tensor], ids: Mapping[str, Tensor], *, enabled: bool = True
) -> GatheredBatch:
    """All-gather ``embeddings`` (with autograd) and ``ids`` (without) across the ranks, once per step."""
    world, rank = world_size(), global_rank()
    first = next(iter(embeddings.values()))
    rows, device = first.shape[0], first.device
    positions = torch.arange(rank * rows, (rank + 1) * rows, device=device)
    local = {**embeddings, **ids}
    if not enabled:
        return GatheredBatch(local, dict(local), positions, positions, rank, world)
    keys = _gather_packed(embeddings, all_gather_with_grad)
    keys.update(_gather_packed(ids, all_gather_tensor))
    return GatheredBatch(local, keys, positions, torch.arange(world * rows, device=device), rank, world)


def _gather_packed(tensors: Mapping[str, Tensor], gather: Callable[[Tensor], Tensor]) -> dict[str, Tensor]:
    """``{name: gather(x)}`` with one collective per dtype: the [rows, …] tensors of a dtype are packed side
    by side as [rows, Σ width], gathered once and cut apart again (fewer, larger messages: each collective
    has a fixed latency). The values are those of gathering each tensor alone; so are the gradients (the
    pack and the cut are differentiable)."""
    groups: dict[tuple[torch.dtype, torch.device], list[str]] = {}
    for name, x in tensors.items():
        groups.setdefault((x.dtype, x.device), []).append(name)
    out: dict[str, Tensor] = {}
    for names in groups.values():
        if len(names) == 1:
            out[names[0]] = gather(tensors[names[0]])
            continue
        flat = [tensors[n].reshape(tensors[n].shape[0], -1) for n in names]
        widths = [f.shape[1] for f in flat]
        packed = gather(torch.cat(flat, dim=1))
        for name, part in zip(names, packed.split(widths, dim=1), strict=False):
            part = part.reshape(packed.shape[0], *tensors[name].shape[1:])
            # ids are searched and indexed (contiguous copies are cheap); embeddings stay views of the gather
            out[name] = part if part.is_floating_point() else part.contiguous()
    return out
