"""Similarities between image and caption embeddings for the ranking losses (``loss.similarity``), and
:func:`l2_normalize`. A :class:`Similarity` is an object a loss or miner takes; each shipped one is a module of
this package that registers its class in :data:`SIMILARITIES` (a new similarity is one file here).

``pairwise`` gives ``[N_img, N_cap]`` score blocks (rows images); ``paired`` scores row k with row k.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from raydist.losses.components import Component, build, component_registry
from raydist.registry import Registry

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


class Similarity(Component):
    """A score ``s(image, caption)``, higher = closer; subclasses give :meth:`pairwise` and :meth:`paired` and
    register with ``@SIMILARITIES.register("name")`` (the ``loss.similarity`` value, set as :attr:`name`).
    ``width_per_score``: how many elements per score the pairwise block needs at its peak (1 for a matrix
    product; D for a broadcast ``[rows, cols, D]`` intermediate), which sizes the score tiles."""

    broadcasts: ClassVar[bool] = False  # pairwise builds a [rows, cols, D] intermediate

    def pairwise(self, img: Tensor, cap: Tensor) -> Tensor:
        """Score block ``[len(img), len(cap)]``, rows images, columns captions."""
        raise NotImplementedError

    def paired(self, img: Tensor, cap: Tensor) -> Tensor:
        """Score of each row's own pair ``[N]`` (the diagonal of :meth:`pairwise`)."""
        raise NotImplementedError

    def width_per_score(self, dim: int) -> int:
        """Elements per score of the pairwise block at its peak: ``dim`` when it broadcasts, else 1."""
        return dim if self.broadcasts else 1


SIMILARITIES: Registry[type[Similarity]] = component_registry("similarity", Similarity, __name__)


def get_similarity(similarity: str | Similarity) -> Similarity:
    """A :class:`Similarity`: ``similarity`` itself, or the registered one of that name (unknown: a ValueError
    naming the close ones)."""
    return build(SIMILARITIES, similarity)


def pairwise_similarity(img: Tensor, cap: Tensor, similarity: str | Similarity = "dot") -> Tensor:
    """Score block ``[len(img), len(cap)]`` of ``similarity`` (a name or an object), rows images."""
    return get_similarity(similarity).pairwise(img, cap)


def paired_similarity(img: Tensor, cap: Tensor, similarity: str | Similarity = "dot") -> Tensor:
    """Score of each row's own pair ``[N]`` (the positives) of ``similarity`` (a name or an object)."""
    return get_similarity(similarity).paired(img, cap)
