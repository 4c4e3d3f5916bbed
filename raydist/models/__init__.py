"""Encoders and joint embedding models."""

from raydist.models.image_encoders import (
    backbone_parameters,
    build_image_encoder,
    image_encoder_names,
    register_image_encoder,
)
from raydist.models.text_encoders import (
    TextEncoder,
    build_text_encoder,
    register_text_encoder,
    text_encoder_names,
)
from raydist.models.vse import ImageEncoder, VSEModel, build_model
from raydist.models.wrapped import unwrap_model

__all__ = [
    "ImageEncoder",
    "TextEncoder",
    "VSEModel",
    "backbone_parameters",
    "build_image_encoder",
    "build_model",
    "build_text_encoder",
    "image_encoder_names",
    "register_image_encoder",
    "register_text_encoder",
    "text_encoder_names",
    "unwrap_model",
]
