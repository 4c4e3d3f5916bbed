"""What the tasks share for encoded images (PNG/JPEG bytes in the shards): the crop size and transforms a config
asks for, the refusal of an image encoder that does not fit the data, and a split's eval image embeddings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from raydist.config import Config, ConfigError
from raydist.data.image_transforms import ImageTransform, decode_images
from raydist.data.stream import fits_in_memory
from raydist.data.transforms import ImageViews
from raydist.models import image_encoder_names
from raydist.models.image_encoders import image_encoder_problem
from raydist.tasks.base import DataInfo

MAX_DEFAULT_SIZE = 224  # the default crop never exceeds the usual ImageNet input side


def crop_size(cfg: Config, info: DataInfo) -> int:
    """``data.image_size``, else the shorter side of the train split's median image (the manifest's
    ``image_size``) capped at :data:`MAX_DEFAULT_SIZE`."""
    if cfg.data.image_size is not None:
        return cfg.data.image_size
    if info.image_size is None:
        raise ValueError("encoded images need data.image_size or the manifest's image_size")
    return min(min(info.image_size), MAX_DEFAULT_SIZE)


def image_transform(cfg: Config, info: DataInfo, *, train: bool) -> ImageTransform:
    """The :class:`ImageTransform` of a run: random resized crop (+ flip when ``data.flip``) seeded by
    ``train.seed`` for training, resize + centre crop for evaluation, both to :func:`crop_size`."""
    return ImageTransform(size=crop_size(cfg, info), channels=info.image_channels or 3, train=train,
                          flip=cfg.data.flip, seed=cfg.train.seed, scale=tuple(cfg.data.crop_scale))  # fmt: skip


def _known_encoder(name: str) -> bool:
    family, sep, model = name.partition(":")
    return (f"{family}:" in image_encoder_names() and bool(model)) if sep else name in image_encoder_names()


def image_config_problems(cfg: Config, info: DataInfo) -> list[str]:
    """Why ``cfg``'s image settings do not fit the dataset ``info`` describes, one line each ([] when they do)."""
    m, d = cfg.model, cfg.data
    where = str(info.data_dir) if info.data_dir else "the dataset"
    if not _known_encoder(m.image_encoder):
        known = ", ".join(n + "<model>" if n.endswith(":") else n for n in image_encoder_names())
        return [f"model.image_encoder={m.image_encoder}: unknown image encoder; known: {known}"]
    problems = []
    if m.image_weights and not Path(m.image_weights).expanduser().is_file():
        problems.append(f"model.image_weights={m.image_weights}: no such file (a local state dict of the backbone)")
    if not info.encoded:
        if m.image_encoder != "linear":
            problems.append(f"model.image_encoder={m.image_encoder}: {where} holds precomputed feature vectors "
                            f"(manifest image_format 'features', feature_dim {info.feature_dim}); an image encoder "
                            "needs encoded images (raydist convert karpathy | coco-json --images | image-folder); "
                            "use model.image_encoder=linear")  # fmt: skip
        defaults = type(d)()  # the keys' own defaults (raydist.config.DataSection)
        for name in ("image_size", "flip", "crop_scale"):
            key, value, default = f"data.{name}", getattr(d, name), getattr(defaults, name)
            if value != default:
                problems.append(f"{key}={value}: {where} holds feature vectors; {key} is for encoded images")
        return problems
    if m.image_encoder == "linear":
        problems.append(f"model.image_encoder=linear: {where} holds encoded images (manifest image_format "
                        "'encoded') and 'linear' takes precomputed feature vectors; choose an image encoder: "
                        "small-cnn (small images), torchvision:<model> or timm:<model>")  # fmt: skip
    if cfg.gc.measure or cfg.gc.sample:
        problems.append("gc.measure/gc.sample: gradient clustering reads feature vectors; it does not run on "
                        f"encoded images ({where})")  # fmt: skip
    if not problems:  # the encoder itself, built on the meta device, and its weights file's names and shapes
        weights = str(Path(m.image_weights).expanduser()) if m.image_weights else None
        problem = image_encoder_problem(m.image_encoder, weights, channels=info.image_channels or 3,
                                        image_size=crop_size(cfg, info))  # fmt: skip
        problems += [problem] if problem else []
    return problems


def check_image_config(cfg: Config, info: DataInfo) -> None:
    """Raise a ConfigError listing :func:`image_config_problems` (before Ray starts), or return."""
    problems = image_config_problems(cfg, info)
    if problems:
        raise ConfigError("the image settings are refused:\n  " + "\n  ".join(problems))


@torch.no_grad()
def embed_views(encoder: nn.Module, views: ImageViews, *, batch_size: int,
                device: torch.device | str = "cpu") -> torch.Tensor:  # fmt: skip
    """``encoder`` over eval views made ``batch_size`` images at a time, in eval mode: [N, D] on the CPU."""
    was_training = encoder.training
    encoder.eval()
    out = [encoder(torch.as_tensor(views[s : s + batch_size]).to(device)).cpu()
           for s in range(0, len(views), batch_size)]  # fmt: skip
    encoder.train(was_training)
    return torch.cat(out)


def eval_images(cfg: Config, info: DataInfo, split: str, images: np.ndarray) -> np.ndarray:
    """A split's encoded image column, decoded once into uint8 pixels when the split fits
    ``data.in_memory_max_mb`` (so each evaluation only resizes and crops), else as it is (decoded per
    evaluation, a batch at a time)."""
    if info.data_dir is not None and fits_in_memory(info.data_dir, split, cfg.data.in_memory_max_mb):
        return decode_images(images, info.image_channels or 3)
    return images
