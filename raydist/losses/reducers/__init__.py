"""Reducers: per-element loss terms → the scalar a rank backpropagates (sum, mean, the ×W of cross-worker
negatives)."""

from __future__ import annotations

from torch import Tensor

from raydist.choices import REDUCTIONS


def reduce_queries(total: Tensor, reduction: str, num_query_terms: int) -> Tensor:
    """``"sum"``: the total as is (VSE++); ``"mean"``: the total divided by the number of query terms.

    In :func:`raydist.losses.ranking_loss` there are ``2N`` query terms (N image + N caption queries).
    """
    if reduction == "sum":
        return total
    if reduction == "mean":
        return total / num_query_terms
    raise ValueError(f"reduction={reduction!r}: expected one of {REDUCTIONS}")


def scale_for_world(loss: Tensor, world: int) -> Tensor:
    """``W · loss``: a rank's share of a global loss whose keys were gathered with autograd.

    The gather's backward sums key gradients back to their owners and DDP then averages over the W ranks,
    so scaling each rank's loss by W makes the parameter gradients equal those of one process holding the
    whole global batch (and the mean over ranks of the returned values equals the global loss).
    """
    return world * loss
