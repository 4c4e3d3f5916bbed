"""MLP encoder with an L2-normalised output and a linear classification head (the ``labels`` task)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from raydist.losses import l2_normalize
from raydist.models.matryoshka import MatryoshkaHead


class MLPEncoder(nn.Module):
    """``f(x) = normalize(W_L σ(… σ(W_1 x)))`` with ReLU between the ``hidden`` layers."""

    def __init__(self, feature_dim: int, hidden: Sequence[int], embed_dim: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = feature_dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, embed_dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return l2_normalize(self.net(x))


class LabelsModel(nn.Module):
    """Embedding encoder + classification head on the unit-norm embedding; returns (embedding, logits).

    With ``nesting`` the head is MRL-E (one weight matrix sliced per nesting dim) and ``logits`` is the list
    of per-dim logits, largest dim last.
    """

    def __init__(
        self,
        feature_dim: int | None,
        hidden: Sequence[int],
        embed_dim: int,
        num_classes: int,
        nesting: Sequence[int] = (),
        encoder: nn.Module | None = None,
    ) -> None:
        """``encoder``: unit embeddings of the inputs (e.g. a CNN over pixels); default the MLP over features."""
        super().__init__()
        self.encoder = encoder if encoder is not None else MLPEncoder(feature_dim, hidden, embed_dim)
        self.head = (
            MatryoshkaHead(embed_dim, num_classes, nesting) if nesting else nn.Linear(embed_dim, num_classes)
        )

    def forward(
        self, x: torch.Tensor, probe: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | list[torch.Tensor]]:
        """``probe=True``: the head sees the detached embedding (a linear probe; no encoder gradient)."""
        emb = self.encoder(x)
        return emb, self.head(emb.detach() if probe else emb)
