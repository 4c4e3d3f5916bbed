"""Reducers: per-element loss terms → the scalar a rank backpropagates (``loss.reduction``). A :class:`Reducer`
gives a :class:`TermSum` (the total and the count it divides by, which a cross-worker loss may replace by the
global count); each shipped one is a module of this package registered in :data:`REDUCERS` (a new reducer is
one file here). :func:`scale_for_world` is the ×W of a cross-worker loss.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from raydist.losses.components import Component, build, component_registry
from raydist.registry import Registry


class TermSum(NamedTuple):
    """A loss before its division: ``total`` (sum of the terms the reduction keeps) and ``count`` (how many
    terms it divides by; None for "sum", which never divides)."""

    total: Tensor
    count: Tensor | None

    def value(self, count: Tensor | None = None) -> Tensor:
        """``total / max(count, 1)`` ("sum": ``total``). ``count`` replaces the own count (e.g. by the count
        over all ranks); with nothing counted the total is a graph-connected 0, so the value is 0."""
        if self.count is None:
            return self.total
        return self.total / (self.count if count is None else count).clamp(min=1)


class Reducer(Component):
    """Per-element terms ``x`` [T] → a scalar; subclasses give :meth:`parts` and register with
    ``@REDUCERS.register("name")`` (the ``loss.reduction`` value, set as :attr:`name`)."""

    def parts(self, terms: Tensor) -> TermSum:
        """The total and the count of ``terms`` (the division is :meth:`TermSum.value`)."""
        raise NotImplementedError

    def of_total(self, total: Tensor, count: int) -> Tensor:
        """The reduced value from the sum of ``count`` terms (a loss that sums its terms as it goes); a reducer
        that must see the terms refuses it."""
        raise ValueError(f"reduction {self.name!r} needs the terms, not their sum")

    @classmethod
    def reduces_totals(cls) -> bool:
        """Whether :meth:`of_total` gives the value from a sum of terms (a loss that sums as it goes may use it)."""
        return cls.of_total is not Reducer.of_total

    def __call__(self, terms: Tensor) -> Tensor:
        """The reduced value: :meth:`parts` divided."""
        return self.parts(terms).value()


REDUCERS: Registry[type[Reducer]] = component_registry("reduction", Reducer, __name__)


def get_reducer(reduction: str | Reducer) -> Reducer:
    """A :class:`Reducer`: ``reduction`` itself, or the registered one of that name (unknown: a ValueError
    naming the close ones)."""
    return build(REDUCERS, reduction)


def reduce_terms(terms: Tensor, reduction: str | Reducer) -> TermSum:
    """Terms ``x`` [T] → the :class:`TermSum` of the reducer ``reduction`` (a name or an object)."""
    return get_reducer(reduction).parts(terms)


def reduce_queries(total: Tensor, reduction: str | Reducer, num_query_terms: int) -> Tensor:
    """The reduced value of ``num_query_terms`` terms that sum to ``total``: ``"sum"`` the total as is
    (VSE++); ``"mean"`` the total divided by the number of query terms.

    In :func:`raydist.losses.ranking_loss` there are ``2N`` query terms (N image + N caption queries).
    """
    return get_reducer(reduction).of_total(total, num_query_terms)


def scale_for_world(loss: Tensor, world: int) -> Tensor:
    """``W · loss``: a rank's share of a global loss whose keys were gathered with autograd.

    The gather's backward sums key gradients back to their owners and DDP then averages over the W ranks,
    so scaling each rank's loss by W makes the parameter gradients equal those of one process holding the
    whole global batch (and the mean over ranks of the returned values equals the global loss).
    """
    return world * loss
