"""VSE++ joint embedding: linear projection of precomputed image features + GRU caption encoder.

Both embeddings are L2-normalised (images optionally not, the VSE0 ``no_imgnorm`` option).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from raydist.config import Config, ModelSection
from raydist.losses import l2_normalize
from raydist.models.image_encoders import image_encoder_from_config


class ImageEncoder(nn.Module):
    """``f(I) = normalize(W x + b)`` over precomputed features x (Faghri et al. 2018, §3)."""

    def __init__(self, feature_dim: int, embed_dim: int, no_imgnorm: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(feature_dim, embed_dim)
        self.no_imgnorm = no_imgnorm
        bound = math.sqrt(6.0) / math.sqrt(feature_dim + embed_dim)  # Xavier uniform, as VSE++
        nn.init.uniform_(self.fc.weight, -bound, bound)
        nn.init.zeros_(self.fc.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out = self.fc(features)
        return out if self.no_imgnorm else l2_normalize(out)


class TextEncoder(nn.Module):
    """``g(C) = normalize(GRU(embed(words))[last valid step])`` over packed sequences."""

    def __init__(self, vocab_size: int, word_dim: int, embed_dim: int, num_layers: int = 1) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, word_dim)
        self.rnn = nn.GRU(word_dim, embed_dim, num_layers, batch_first=True)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(
            self.embed(tokens), lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        _, hidden = self.rnn(packed)  # [num_layers, B, H], already at each sequence's last step
        return l2_normalize(hidden[-1])


class VSEModel(nn.Module):
    """Image and caption encoders into one joint space."""

    def __init__(self, feature_dim: int | None, vocab_size: int, cfg: ModelSection,
                 image: nn.Module | None = None) -> None:  # fmt: skip
        """``image``: the image side (e.g. a CNN over pixels); default the linear projection of features."""
        super().__init__()
        self.image = image if image is not None else ImageEncoder(feature_dim, cfg.embed_dim, cfg.no_imgnorm)
        self.text = TextEncoder(vocab_size, cfg.word_dim, cfg.embed_dim, cfg.num_layers)

    def forward(
        self, features: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.image(features), self.text(tokens, lengths)


def build_model(cfg: Config, feature_dim: int | None, vocab_size: int, *, channels: int | None = None,
                image_size: int | None = None) -> VSEModel:  # fmt: skip
    """The model a run config describes, for a dataset's feature dim and vocabulary size; with
    ``model.image_encoder`` other than ``linear``, its image side is that encoder over ``channels`` ×
    ``image_size``² images."""
    if cfg.model.image_encoder == "linear":
        return VSEModel(feature_dim, vocab_size, cfg.model)
    if channels is None or image_size is None:
        raise ValueError(f"model.image_encoder={cfg.model.image_encoder} needs the images' channels and size")
    image = image_encoder_from_config(cfg.model, channels=channels, image_size=image_size,
                                      normalize=not cfg.model.no_imgnorm)  # fmt: skip
    return VSEModel(feature_dim, vocab_size, cfg.model, image)
