"""The dot-product similarity ``f(I)·g(C)`` (``loss.similarity=dot``; VSE++)."""

from __future__ import annotations

from torch import Tensor

from raydist.losses.similarity import SIMILARITIES, Similarity


@SIMILARITIES.register("dot")
class DotSimilarity(Similarity):
    """``S[k, l] = f(I_k) · g(C_l)`` (cosine similarity for unit-norm rows)."""

    def pairwise(self, img: Tensor, cap: Tensor) -> Tensor:
        return img @ cap.T

    def paired(self, img: Tensor, cap: Tensor) -> Tensor:
        """``s_k = f(I_k) · g(C_k)`` without the full matrix."""
        return (img * cap).sum(-1)
