"""Matryoshka (nested) losses: one loss applied to re-normalised prefixes of the embedding
(docs/algorithms.md#matryoshka-loss).

Owns the prefix views (the nesting-list checks are :mod:`raydist.nesting`); the wrapped loss never knows it is nested.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

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
        tensors, rest = _split_embeddings(args)
        views = [nested_views(t, self.dims) for t in tensors]
        return [self.loss_fn(*per_dim, *rest, **kwargs) for per_dim in zip(*views)]

    def __call__(self, *args: Any, **kwargs: Any) -> Tensor:
        """``Σ_m c_m · L_m`` with the terms of :meth:`terms` (same arguments)."""
        return sum(c * t for c, t in zip(self.weights, self.terms(*args, **kwargs)))


def nested_loss(
    loss_fn: Callable[..., Tensor], dims: Sequence[int], weights: Sequence[float] | None = None
) -> NestedLoss:
    """Wrap ``loss_fn`` as the Matryoshka loss ``Σ_m c_m · loss_fn(normalize(z[:, :m]))``.

    ``dims``: distinct positive ints in any order, sorted here (the largest is checked against the embedding
    on call); ``weights`` ``c_m``: one finite non-negative number per dim, in the order of ``dims`` as given,
    default all 1.
    """
    ordered = check_nesting(dims, any_order=True)
    weight_of = dict(zip(dims, check_weights(weights, len(ordered))))
    return NestedLoss(loss_fn, ordered, tuple(weight_of[m] for m in ordered))
