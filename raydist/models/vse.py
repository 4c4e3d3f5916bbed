"""VSE++ joint embedding: linear projection of precomputed image features (or an image encoder) + a caption
encoder (GRU by default, :mod:`raydist.models.text_encoders`).

Both embeddings are L2-normalised (images optionally not, the VSE0 ``no_imgnorm`` option).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from raydist.config import Config, ModelSection
from raydist.losses import l2_normalize
from raydist.models.image_encoders import image_encoder_from_config
from raydist.models.text_encoders import TextEncoder, text_encoder_from_config


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


class VSEModel(nn.Module):
    """Image and caption encoders into one joint space."""

    def __init__(
        self,
        feature_dim: int | None,
        vocab_size: int,
        cfg: ModelSection,
        image: nn.Module | None = None,
        text: nn.Module | None = None,
    ) -> None:
        """``image``: the image side (e.g. a CNN over pixels); default the linear projection of features.
        ``text``: the caption side (:mod:`raydist.models.text_encoders`); default VSE++'s GRU."""
        super().__init__()
        self.image = image if image is not None else ImageEncoder(feature_dim, cfg.embed_dim, cfg.no_imgnorm)
        self.text = (
            text if text is not None else TextEncoder(vocab_size, cfg.word_dim, cfg.embed_dim, cfg.num_layers)
        )

    def forward(
        self, features: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.image(features), self.text(tokens, lengths)


def build_model(
    cfg: Config,
    feature_dim: int | None,
    vocab_size: int,
    *,
    channels: int | None = None,
    image_size: int | None = None,
    pad_id: int = 0,
) -> VSEModel:
    """The model a run config describes, for a dataset's feature dim and a tokenizer of ``vocab_size`` ids
    (padding ``pad_id``); its caption side is ``model.text_encoder``. With ``model.image_encoder`` other than
    ``linear``, its image side is that encoder over ``channels`` × ``image_size``² images."""
    text = text_encoder_from_config(
        cfg.model, vocab_size=vocab_size, max_len=cfg.data.max_caption_len, pad_id=pad_id
    )
    if cfg.model.image_encoder == "linear":
        return VSEModel(feature_dim, vocab_size, cfg.model, text=text)
    if channels is None or image_size is None:
        raise ValueError(f"model.image_encoder={cfg.model.image_encoder} needs the images' channels and size")
    image = image_encoder_from_config(
        cfg.model, channels=channels, image_size=image_size, normalize=not cfg.model.no_imgnorm
    )
    return VSEModel(feature_dim, vocab_size, cfg.model, image, text)
