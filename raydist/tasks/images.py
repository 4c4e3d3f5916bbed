"""What the tasks share for encoded images (PNG/JPEG bytes in the shards): the crop size and transforms a config
asks for, the refusal of an image encoder that does not fit the data, and a split's eval image embeddings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from raydist.config import Config, ConfigError
from raydist.data.image_transforms import ImageTransform, decode_images
from raydist.data.mirror import mirror_verdict
from raydist.data.stream import fits_in_memory
from raydist.data.transforms import ImageViews
from raydist.distributed.shards import map_batches
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


PAD_CROP_MAX_SIDE = (
    64  # data.crop=auto: crops up to this side pad-and-crop (CIFAR), larger ones resize (ImageNet)
)


@dataclass(frozen=True)
class Augmentation:
    """A run's train-view transforms, in order, each with the reason it is on (or off): the crop (``"pad"``
    with ``pad`` pixels, ``"resized"`` with ``scale``, or ``"none"``), then the flip. ``data.crop=auto`` and
    ``data.flip=auto`` are decided here from the data."""

    crop: str
    pad: int
    scale: tuple[float, float]
    flip: bool
    crop_reason: str
    flip_reason: str

    def line(self) -> str:
        """The one console line a run prints about its augmentation."""
        crop = {
            "pad": f"pad {self.pad} px + random crop at the image's size",
            "resized": f"random resized crop of {self.scale[0]:g}–{self.scale[1]:g} of the area",
            "none": "no crop (the whole image)",
        }[self.crop]
        flip = "left–right flips" if self.flip else "no flips"
        return f"augment: {crop} ({self.crop_reason}); {flip} ({self.flip_reason})"

    def overrides(self) -> dict[str, object]:
        """The config values this augmentation resolves ``auto`` to."""
        return {"data.crop": self.crop, "data.crop_pad": self.pad or None, "data.flip": self.flip}


def crop_choice(cfg: Config, info: DataInfo) -> tuple[str, str]:
    """``data.crop``, ``auto`` resolved by the crop side (:func:`augmentation`), and the reason."""
    if cfg.data.crop != "auto":
        return cfg.data.crop, "data.crop"
    size = crop_size(cfg, info)
    small = size <= PAD_CROP_MAX_SIDE
    return ("pad" if small else "resized"), (
        f"{size} px {'≤' if small else '>'} {PAD_CROP_MAX_SIDE}: the "
        f"{'CIFAR' if small else 'ImageNet'} recipe; data.crop= to choose"
    )


def view_size(cfg: Config, info: DataInfo) -> int | tuple[int, int]:
    """The side (or [height, width]) of a run's train and eval views: ``data.image_size``; else, for ``pad`` and
    ``none`` crops, the train split's median image as it is (a 32×16 half-digit stays 32×16: a square crop
    would cut half of it away); else :func:`crop_size` (a random resized crop is square)."""
    if cfg.data.image_size is None and info.image_size is not None and crop_choice(cfg, info)[0] != "resized":
        height, width = info.image_size
        return height if height == width else (height, width)
    return crop_size(cfg, info)


def augmentation(cfg: Config, info: DataInfo) -> Augmentation:
    """The train views' transforms for ``cfg`` on the encoded dataset ``info`` describes:

    - ``data.crop=auto``: ``pad`` for crops up to :data:`PAD_CROP_MAX_SIDE` px -- the recipe small images are
      trained with (CIFAR/MNIST: pad, then a random window at the image's own size; a shift, no rescaling) --
      and ``resized`` for larger ones (ImageNet's random resized crop of ``data.crop_scale`` of the area);
    - ``data.crop_pad`` null: an eighth of the crop side (4 px at 32 px, CIFAR's);
    - ``data.flip=auto``: :func:`raydist.data.mirror.mirror_verdict` (flips only where the data looks the same
      mirrored and no caption names a side).
    """
    d = cfg.data
    size = crop_size(cfg, info)
    crop, crop_reason = crop_choice(cfg, info)
    pad = (d.crop_pad or max(1, round(size / 8))) if crop == "pad" else 0
    flip, flip_reason = d.flip, "data.flip"
    if flip == "auto":
        if info.data_dir is None:
            raise ValueError(
                "data.flip=auto is decided from the dataset's images: it needs the dataset folder"
            )
        verdict = mirror_verdict(str(info.data_dir))
        flip, flip_reason = verdict.flip, f"{verdict.reason}; data.flip= to choose"
    return Augmentation(crop, pad, tuple(d.crop_scale), bool(flip), crop_reason, flip_reason)


def image_transform(cfg: Config, info: DataInfo, *, train: bool) -> ImageTransform:
    """The :class:`ImageTransform` of a run: the :func:`augmentation`'s crop and flip seeded by ``train.seed``
    for training, resize + centre crop for evaluation (the whole image after ``pad``/``none`` crops, 87.5 % of it
    after resized ones), both to :func:`view_size`."""
    size, channels = view_size(cfg, info), info.image_channels or 3
    if not train:  # pad/none crops train at the images' own scale, so evaluation takes the whole image too
        whole = crop_choice(cfg, info)[0] != "resized"
        return ImageTransform(
            size=size,
            channels=channels,
            train=False,
            flip=False,
            seed=cfg.train.seed,
            crop_fraction=1.0 if whole else 0.875,
        )
    aug = augmentation(cfg, info)
    return ImageTransform(
        size=size,
        channels=channels,
        train=True,
        flip=aug.flip,
        seed=cfg.train.seed,
        scale=aug.scale,
        crop=aug.crop,
        pad=aug.pad,
    )


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
        problems.append(
            f"model.image_weights={m.image_weights}: no such file (a local state dict of the backbone)"
        )
    if not info.encoded:
        if m.image_encoder != "linear":
            problems.append(
                f"model.image_encoder={m.image_encoder}: {where} holds precomputed feature vectors "
                f"(manifest image_format 'features', feature_dim {info.feature_dim}); an image encoder "
                "needs encoded images (raydist convert karpathy | coco-json --images | image-folder); "
                "use model.image_encoder=linear"
            )
        defaults = type(d)()  # the keys' own defaults (raydist.config.DataSection)
        for name in ("image_size", "flip", "crop", "crop_pad", "crop_scale"):
            key, value, default = f"data.{name}", getattr(d, name), getattr(defaults, name)
            if value != default:
                problems.append(f"{key}={value}: {where} holds feature vectors; {key} is for encoded images")
        return problems
    if m.image_encoder == "linear":
        problems.append(
            f"model.image_encoder=linear: {where} holds encoded images (manifest image_format "
            "'encoded') and 'linear' takes precomputed feature vectors; choose an image encoder: "
            "small-cnn (small images), torchvision:<model> or timm:<model>"
        )
    if cfg.gc.measure or cfg.gc.sample:
        problems.append(
            "gc.measure/gc.sample: gradient clustering reads feature vectors; it does not run on "
            f"encoded images ({where})"
        )
    if not problems:  # the encoder itself, built on the meta device, and its weights file's names and shapes
        weights = str(Path(m.image_weights).expanduser()) if m.image_weights else None
        problem = image_encoder_problem(
            m.image_encoder, weights, channels=info.image_channels or 3, image_size=crop_size(cfg, info)
        )
        problems += [problem] if problem else []
    return problems


def check_image_config(cfg: Config, info: DataInfo) -> None:
    """Raise a ConfigError listing :func:`image_config_problems` (before Ray starts), or return."""
    problems = image_config_problems(cfg, info)
    if problems:
        raise ConfigError("the image settings are refused:\n  " + "\n  ".join(problems))


@torch.no_grad()
def embed_views(
    encoder: nn.Module, views: ImageViews, *, batch_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``encoder`` over eval views made ``batch_size`` images at a time, in eval mode (the batches shared out
    over the ranks inside :func:`raydist.distributed.shards.sharded_batches`): [N, D] on the CPU."""
    was_training = encoder.training
    encoder.eval()
    out = map_batches(
        lambda s, e: encoder(torch.as_tensor(views[s:e]).to(device)).cpu(), len(views), batch_size
    )
    encoder.train(was_training)
    return out


def eval_images(cfg: Config, info: DataInfo, split: str, images: np.ndarray) -> np.ndarray:
    """A split's encoded image column, decoded once into uint8 pixels when the split fits
    ``data.in_memory_max_mb`` (so each evaluation only resizes and crops), else as it is (decoded per
    evaluation, a batch at a time)."""
    if info.data_dir is not None and fits_in_memory(info.data_dir, split, cfg.data.in_memory_max_mb):
        return decode_images(images, info.image_channels or 3)
    return images


def pixel_views(cfg: Config, info: DataInfo, pixels: Sequence[np.ndarray]) -> ImageViews:
    """The eval views (:func:`image_transform`, ``train=False``) of decoded images, made a batch at a time: what
    a model trained on encoded images embeds new images with. A model trained on feature vectors has no image
    encoder to take them (NotImplementedError)."""
    if not info.encoded:
        raise NotImplementedError(
            f"this {info.task!r} model was trained on feature vectors, not encoded images: embed feature "
            "vectors instead"
        )
    column = np.empty(len(pixels), dtype=object)
    for i, p in enumerate(pixels):
        column[i] = p
    return ImageViews(column, image_transform(cfg, info, train=False))
