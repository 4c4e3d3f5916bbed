"""Order-embedding similarity (Vendrov et al. 2016; ``loss.similarity=order``)."""

from __future__ import annotations

from torch import Tensor

from raydist.losses.similarity import SIMILARITIES, Similarity


@SIMILARITIES.register("order")
class OrderSimilarity(Similarity):
    """``S[k, l] = −‖max(0, g(C_l) − f(I_k))‖²``: a caption scores 0 when it lies below the image in every
    coordinate."""

    broadcasts = True  # a [N_img, N_cap, D] intermediate (no python loop; memory O(N_img·N_cap·D))

    def pairwise(self, img: Tensor, cap: Tensor) -> Tensor:
        return -(cap.unsqueeze(0) - img.unsqueeze(1)).clamp(min=0).pow(2).sum(-1)

    def paired(self, img: Tensor, cap: Tensor) -> Tensor:
        """``s_k = −‖max(0, g(C_k) − f(I_k))‖²``: the diagonal of :meth:`pairwise`."""
        return -(cap - img).clamp(min=0).pow(2).sum(-1)
