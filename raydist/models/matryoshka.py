"""Matryoshka classification heads: logits from each nested prefix of an embedding (MRL and MRL-E).

Owns the per-prefix linear heads; their nested cross-entropy ``Σ_m c_m · CE(logits_m, y)`` is the one
Matryoshka sum of every loss (:func:`raydist.losses.nested_sum`; docs/algorithms.md#matryoshka-loss).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from raydist.nesting import check_embedding_dim, check_nesting


class MatryoshkaHead(nn.Module):
    """Linear classifiers over the prefixes ``z[:, :m]``, one per nesting dim m.

    ``z`` is the raw (un-normalised) embedding: each classifier sees the plain prefix, as a linear
    probe on backbone features would. MRL-E (``efficient=True``) shares one ``W [C, D]`` and bias
    ``b [C]``: ``logits_m = z[:, :m] W[:, :m]ᵀ + b``. MRL (``efficient=False``) has an independent
    ``nn.Linear(m, C)`` per m.
    """

    def __init__(
        self, embed_dim: int, num_classes: int, nesting: Sequence[int], efficient: bool = True
    ) -> None:
        super().__init__()
        self.nesting = check_nesting(nesting)
        check_embedding_dim(self.nesting, embed_dim)
        self.efficient = efficient
        if efficient:
            self.shared = nn.Linear(embed_dim, num_classes)
        else:
            self.heads = nn.ModuleList(nn.Linear(m, num_classes) for m in self.nesting)

    def forward(self, z: Tensor) -> list[Tensor]:
        """Logits ``[B, C]`` for each nesting dim, in the order of ``nesting``."""
        if self.efficient:
            w, b = self.shared.weight, self.shared.bias
            return [F.linear(z[:, :m], w[:, :m], b) for m in self.nesting]
        return [head(z[:, :m]) for head, m in zip(self.heads, self.nesting, strict=False)]
