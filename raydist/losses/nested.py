"""Matryoshka (nested) losses: one loss applied to re-normalised prefixes of the embedding
(docs/algorithms.md#matryoshka-loss).

Owns the nesting-list checks and the prefix views; the wrapped loss never knows it is nested.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Sequence

from torch import Tensor

from raydist.losses.similarity import l2_normalize


def check_nesting(dims: Sequence[int]) -> tuple[int, ...]:
    """The nesting list as a tuple; it must be non-empty, of positive ints, strictly increasing."""
    if isinstance(dims, (str, bytes)) or len(dims) == 0:
        raise ValueError(f"dims={dims!r}: expected a non-empty sequence of positive ints")
    if any(isinstance(m, bool) for m in dims):
        raise ValueError(f"dims={dims!r}: expected ints, got a bool")
    out = tuple(operator.index(m) for m in dims)
    if out[0] < 1 or any(a >= b for a, b in itertools.pairwise(out)):
        raise ValueError(f"dims={out}: expected strictly increasing positive ints")
    return out


def check_embedding_dim(dims: Sequence[int], embed_dim: int) -> None:
    """The largest prefix must fit in the embedding: ``max(dims) <= embed_dim``."""
    if dims[-1] > embed_dim:
        raise ValueError(f"nesting dim {dims[-1]} exceeds the embedding dim {embed_dim} (dims={tuple(dims)})")


def check_weights(weights: Sequence[float] | None, count: int) -> tuple[float, ...]:
    """Per-prefix weights ``c_m``: ``count`` finite non-negative numbers; ``None`` means all 1."""
    out = (1.0,) * count if weights is None else tuple(float(c) for c in weights)
    if len(out) != count:
        raise ValueError(f"{len(out)} weights for {count} nesting dims")
    if any(not math.isfinite(c) or c < 0 for c in out):
        raise ValueError(f"weights={out}: expected finite non-negative numbers")
    return out


def nested_views(x: Tensor, dims: Sequence[int]) -> list[Tensor]:
    """``[normalize(x[..., :m]) for m in dims]``: each prefix re-normalised to unit L2 norm.

    Use it after a cross-worker gather of the raw embeddings, so one gather serves every prefix.
    """
    dims = check_nesting(dims)
    check_embedding_dim(dims, x.shape[-1])
    return [l2_normalize(x[..., :m]) for m in dims]


class NestedLoss:
    """``L_M(z) = Σ_m c_m · L(normalize(z[:, :m]))`` over the nesting list M (Kusupati et al. 2022, §3)."""

    def __init__(self, loss_fn: Callable[..., Tensor], dims: Sequence[int], weights: Sequence[float]) -> None:
        self.loss_fn = loss_fn
        self.dims = dims
        self.weights = weights

    def terms(self, embeddings: Tensor | Sequence[Tensor], *args, **kwargs) -> list[Tensor]:
        """Unweighted per-prefix losses ``[L(normalize(z[:, :m])) for m in dims]``.

        ``embeddings`` is one raw tensor or a sequence of them (e.g. ``(img, cap)``); each is sliced
        and re-normalised, then ``loss_fn(*views, *args, **kwargs)`` is called once per prefix.
        """
        tensors = [embeddings] if isinstance(embeddings, Tensor) else list(embeddings)
        views = [nested_views(t, self.dims) for t in tensors]
        return [self.loss_fn(*per_dim, *args, **kwargs) for per_dim in zip(*views)]

    def __call__(self, embeddings: Tensor | Sequence[Tensor], *args, **kwargs) -> Tensor:
        """``Σ_m c_m · L_m`` with the terms of :meth:`terms`."""
        return sum(c * t for c, t in zip(self.weights, self.terms(embeddings, *args, **kwargs)))


def nested_loss(
    loss_fn: Callable[..., Tensor], dims: Sequence[int], weights: Sequence[float] | None = None
) -> NestedLoss:
    """Wrap ``loss_fn`` as the Matryoshka loss ``Σ_m c_m · loss_fn(normalize(z[:, :m]))``.

    ``dims``: strictly increasing positive ints (the largest is checked against the embedding on call);
    ``weights`` ``c_m``: one finite non-negative number per dim, default all 1.
    """
    dims = check_nesting(dims)
    return NestedLoss(loss_fn, dims, check_weights(weights, len(dims)))
