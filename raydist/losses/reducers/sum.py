"""The sum of the terms (``loss.reduction=sum``; VSE++)."""

from __future__ import annotations

from torch import Tensor

from raydist.losses.reducers import REDUCERS, Reducer, TermSum


@REDUCERS.register("sum")
class SumReducer(Reducer):
    """``Σ_t x_t``; never divides."""

    def parts(self, terms: Tensor) -> TermSum:
        return TermSum(terms.sum(), None)

    def of_total(self, total: Tensor, count: int) -> Tensor:
        return total
