"""Encoders and joint embedding models."""

from raydist.models.vse import ImageEncoder, TextEncoder, VSEModel, build_model

__all__ = ["ImageEncoder", "TextEncoder", "VSEModel", "build_model"]
