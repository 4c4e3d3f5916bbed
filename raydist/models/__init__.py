"""Encoders and joint embedding models."""

from raydist.models.vse import ImageEncoder, TextEncoder, VSEModel, build_model
from raydist.models.wrapped import unwrap_model

__all__ = ["ImageEncoder", "TextEncoder", "VSEModel", "build_model", "unwrap_model"]
