"""The mean of the terms (``loss.reduction=mean``)."""

from __future__ import annotations

import torch
from torch import Tensor

from raydist.losses.reducers import REDUCERS, Reducer, TermSum


@REDUCERS.register("mean")
class MeanReducer(Reducer):
    """``Σ_t x_t / T`` (0 for no term, still connected to the graph)."""

    def parts(self, terms: Tensor) -> TermSum:
        return TermSum(terms.sum(), torch.tensor(terms.numel(), device=terms.device))

    def of_total(self, total: Tensor, count: int) -> Tensor:
        return total / count
