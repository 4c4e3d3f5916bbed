"""Distances between embeddings for the metric-learning losses and miners (``loss.distance``): a
:class:`Distance` is an object a loss or miner takes; each shipped one is a module of this package that
registers its class in :data:`DISTANCES` (a new distance is one file here).

``pairwise`` gives ``[len(x), len(y)]`` blocks; ``paired`` compares row k of x with row k of y.
"""

from __future__ import annotations

from torch import Tensor

from raydist.losses.components import Component, build, component_registry
from raydist.registry import Registry

SQUARED_EPS = 1e-12


def safe_sqrt(squared: Tensor) -> Tensor:
    """``sqrt(max(d², ε))`` with ε = 1e-12: below ε the clamp passes no gradient, so identical rows
    (d² = 0, or slightly negative from rounding) get distance 1e-6 and gradient exactly 0, never NaN."""
    return squared.clamp(min=SQUARED_EPS).sqrt()


class Distance(Component):
    """A distance ``d(x, y)`` between rows; subclasses give :meth:`pairwise` and :meth:`paired` and register
    with ``@DISTANCES.register("name")`` (the ``loss.distance`` value, set as :attr:`name`)."""

    def pairwise(self, x: Tensor, y: Tensor) -> Tensor:
        """``D[i, j] = d(x_i, y_j)``, shape ``[len(x), len(y)]``."""
        raise NotImplementedError

    def paired(self, x: Tensor, y: Tensor) -> Tensor:
        """``d_k = d(x_k, y_k)``, shape ``[N]``."""
        raise NotImplementedError


DISTANCES: Registry[type[Distance]] = component_registry("distance", Distance, __name__)


def get_distance(distance: str | Distance) -> Distance:
    """A :class:`Distance`: ``distance`` itself, or the registered one of that name (unknown: a ValueError
    naming the close ones)."""
    return build(DISTANCES, distance)


def pairwise_distance(x: Tensor, y: Tensor, distance: str | Distance = "euclidean") -> Tensor:
    """``D[i, j] = d(x_i, y_j)`` of the distance ``distance`` (a name or an object)."""
    return get_distance(distance).pairwise(x, y)


def paired_distance(x: Tensor, y: Tensor, distance: str | Distance = "euclidean") -> Tensor:
    """``d_k = d(x_k, y_k)`` of the distance ``distance`` (a name or an object)."""
    return get_distance(distance).paired(x, y)
