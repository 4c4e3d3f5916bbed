"""Matryoshka (nested) losses: one loss applied to re-normalised prefixes of the embedding
(docs/algorithms.md#matryoshka-loss).

:func:`nested_sum` is the one Matryoshka sum every loss goes through (a run's loss kinds on the gathered batch,
the labels head's per-prefix logits, :func:`nested_loss` for plain loss functions): ``Σ_m c_m · L(view_m)``,
where a :class:`Prefix` view re-normalises ``z[:, :m]`` and knows its position in the nesting list. Owns
the prefix views (the nesting-list checks are :mod:`raydist.nesting`); the wrapped loss never knows it is nested.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from raydist.losses.similarity import l2_normalize
from raydist.nesting import check_embedding_dim, check_nesting, check_weights


def nested_views(x: Tensor, dims: Sequence[int]) -> list[Tensor]:
    """``[normalize(x[..., :m]) for m in dims]``: each prefix re-normalised to unit L2 norm.

    Use it after a cross-worker gather of the raw embeddings, so one gather serves every prefix.
    """
    dims = check_nesting(dims)
    check_embedding_dim(dims, x.shape[-1])
    return [l2_normalize(x[..., :m]) for m in dims]


@dataclass(frozen=True)
class Prefix:
    """One term of a Matryoshka sum: ``dim`` m (None: no nesting, the whole embedding), its ``index`` in the
    nesting list (0 without nesting) and whether it is the ``largest`` (the term whose statistics a run
    reports). Called on a tensor it gives ``normalize(z[..., :m])`` (without nesting: ``z`` itself)."""

    dim: int | None
    index: int = 0
    largest: bool = True

    def __call__(self, z: Tensor) -> Tensor:
        return z if self.dim is None else l2_normalize(z[..., : self.dim])

    def pick(self, per_dim: Tensor | Sequence[Tensor]) -> Tensor:
        """This prefix's entry of a per-dim list (e.g. a nested head's logits); a tensor is its own entry."""
        return per_dim if isinstance(per_dim, Tensor) else per_dim[self.index]


def nested_sum(
    loss_at: Callable[[Prefix], Tensor], dims: Sequence[int] | None, weights: Sequence[float] | None = None
) -> Tensor:
    """The Matryoshka loss ``Σ_m c_m · loss_at(prefix_m)`` over the nesting list ``dims`` (increasing; weights
    ``c_m`` in that order, default 1); without nesting (``dims`` empty or None) ``loss_at(Prefix(None))``."""
    if not dims:
        return loss_at(Prefix(None))
    dims = check_nesting(dims)
    weights = check_weights(weights or None, len(dims))
    last = len(dims) - 1
    return torch.stack(
        [c * loss_at(Prefix(m, i, i == last)) for i, (m, c) in enumerate(zip(dims, weights, strict=False))]
    ).sum()


def _split_embeddings(args: Sequence[Any]) -> tuple[list[Tensor], tuple[Any, ...]]:
    """``(embeddings, the other positional arguments)`` of a nested loss call.

    The embeddings are the first argument when it is a sequence of tensors (``loss((img, cap), ...)``);
    otherwise the leading tensors with as many dims as the first (``loss(img, cap, ...)``), so a following
    tensor of another rank (labels ``[N]``, a 0-d scale) passes through to the loss.
    """
    if not args:
        raise TypeError("a nested loss needs the embeddings as its first positional argument(s)")
    if not isinstance(args[0], Tensor):
        return list(args[0]), tuple(args[1:])
    rank = args[0].ndim
    count = next((i for i, a in enumerate(args) if not (isinstance(a, Tensor) and a.ndim == rank)), len(args))
    return list(args[:count]), tuple(args[count:])


class NestedLoss:
    """``L_M(z) = Σ_m c_m · L(normalize(z[:, :m]))`` over the nesting list M (Kusupati et al. 2022, §3)."""

    def __init__(self, loss_fn: Callable[..., Tensor], dims: Sequence[int], weights: Sequence[float]) -> None:
        self.loss_fn = loss_fn
        self.dims = dims
        self.weights = weights

    def terms(self, *args: Any, **kwargs: Any) -> list[Tensor]:
        """Unweighted per-prefix losses ``[L(normalize(z[:, :m])) for m in dims]``.

        The raw embeddings come first, as separate tensors (``terms(img, cap, ...)``) or one sequence
        (``terms((img, cap), ...)``; :func:`_split_embeddings`); each is sliced and re-normalised, then
        ``loss_fn(*views, *rest, **kwargs)`` is called once per prefix with the other arguments ``rest``.
        """
        tensors, rest = self._checked(args)
        return [self.loss_fn(*map(Prefix(m), tensors), *rest, **kwargs) for m in self.dims]

    def __call__(self, *args: Any, **kwargs: Any) -> Tensor:
        """``Σ_m c_m · L_m`` (:func:`nested_sum`) with the terms of :meth:`terms` (same arguments)."""
        tensors, rest = self._checked(args)
        return nested_sum(
            lambda view: self.loss_fn(*map(view, tensors), *rest, **kwargs), self.dims, self.weights
        )

    def _checked(self, args: Sequence[Any]) -> tuple[list[Tensor], tuple[Any, ...]]:
        """The embeddings (each checked against the largest dim) and the other positional arguments."""
        tensors, rest = _split_embeddings(args)
        for t in tensors:
            check_embedding_dim(self.dims, t.shape[-1])
        return tensors, rest


def nested_loss(
    loss_fn: Callable[..., Tensor], dims: Sequence[int], weights: Sequence[float] | None = None
) -> NestedLoss:
    """Wrap ``loss_fn`` as the Matryoshka loss ``Σ_m c_m · loss_fn(normalize(z[:, :m]))``.

    ``dims``: distinct positive ints in any order, sorted here (the largest is checked against the embedding
    on call); ``weights`` ``c_m``: one finite non-negative number per dim, in the order of ``dims`` as given,
    default all 1.
    """
    ordered = check_nesting(dims, any_order=True)
    weight_of = dict(zip(dims, check_weights(weights, len(ordered)), strict=False))
    return NestedLoss(loss_fn, ordered, tuple(weight_of[m] for m in ordered))
