"""The mean over the positive terms (the margin loss's mean, Wu et al. 2017)."""

from __future__ import annotations

from torch import Tensor

from raydist.losses.reducers import REDUCERS, Reducer, TermSum


@REDUCERS.register("mean_nonzero")
class MeanNonzeroReducer(Reducer):
    """``Σ_{t: x_t > 0} x_t / #{t: x_t > 0}`` (0 when no term is positive, still connected to the graph)."""

    def parts(self, terms: Tensor) -> TermSum:
        kept = terms > 0
        return TermSum(terms[kept].sum(), kept.sum())
