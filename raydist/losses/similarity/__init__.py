"""Similarities between image and caption embeddings: dot product and order embeddings.

Pairwise functions give ``[N_img, N_cap]`` score blocks (rows images); paired ones score row k with row k.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from raydist.choices import SIMILARITIES

HALF_EPS = 1e-4


def l2_normalize(x: Tensor, eps: float = 1e-8) -> Tensor:
    """``x / max(‖x‖₂, eps)`` along the last dim; a zero row stays zero with finite gradients.

    Half-precision input is normalised in fp32 and returned in fp32, with ``eps >= HALF_EPS``: the
    gradient at a zero row is ``1/eps`` per element and must stay below fp16's maximum (65504) when it
    flows back into the half-precision graph.
    """
    if x.dtype in (torch.float16, torch.bfloat16):
        x, eps = x.float(), max(eps, HALF_EPS)
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(eps)


def dot_similarity(img: Tensor, cap: Tensor) -> Tensor:
    """``S[k, l] = f(I_k) · g(C_l)`` (cosine similarity for unit-norm rows)."""
    return img @ cap.T


def order_similarity(img: Tensor, cap: Tensor) -> Tensor:
    """Order embeddings (Vendrov et al. 2016): ``S[k, l] = −‖max(0, g(C_l) − f(I_k))‖²``.

    Broadcast over a ``[N_img, N_cap, D]`` intermediate (no python loop; memory O(N_img·N_cap·D)).
    """
    return -(cap.unsqueeze(0) - img.unsqueeze(1)).clamp(min=0).pow(2).sum(-1)


def paired_dot_similarity(img: Tensor, cap: Tensor) -> Tensor:
    """``s_k = f(I_k) · g(C_k)``: the diagonal of :func:`dot_similarity` without the full matrix."""
    return (img * cap).sum(-1)


def paired_order_similarity(img: Tensor, cap: Tensor) -> Tensor:
    """``s_k = −‖max(0, g(C_k) − f(I_k))‖²``: the diagonal of :func:`order_similarity`."""
    return -(cap - img).clamp(min=0).pow(2).sum(-1)


_PAIRWISE: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"dot": dot_similarity, "order": order_similarity}
_PAIRED: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "dot": paired_dot_similarity,
    "order": paired_order_similarity,
}


def _check(similarity: str) -> None:
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity={similarity!r}: expected one of {SIMILARITIES}")


def pairwise_similarity(img: Tensor, cap: Tensor, similarity: str = "dot") -> Tensor:
    """Score block ``[len(img), len(cap)]``, rows images, columns captions."""
    _check(similarity)
    return _PAIRWISE[similarity](img, cap)


def paired_similarity(img: Tensor, cap: Tensor, similarity: str = "dot") -> Tensor:
    """Score of each row's own pair ``[N]`` (the positives)."""
    _check(similarity)
    return _PAIRED[similarity](img, cap)
