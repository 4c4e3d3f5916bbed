"""Encoded images (PNG/JPEG bytes) → normalised float32 C×H×W views: decode, a random crop -- Inception's resized
crop (large images) or pad-and-crop at the image's own size (CIFAR's, small images) -- + flip (train), or resize +
centre crop (eval). numpy and Pillow only, so Ray Data's tasks run it without importing torch; a train
view is a pure function of (bytes, seed, epoch, sample_id), so streamed, in-memory and resumed runs agree."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image

from raydist.data.image_bytes import open_image

Batch = dict[str, np.ndarray]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
GREY_MEAN = (0.5,)
GREY_STD = (0.5,)
_MODES = {1: "L", 3: "RGB"}


def _mode(channels: int) -> str:
    if channels not in _MODES:
        raise ValueError(f"channels must be 1 (greyscale) or 3 (RGB), got {channels}")
    return _MODES[channels]


def image_pixels(img: Image.Image, channels: int) -> np.ndarray:
    """The H×W×C uint8 pixels of a Pillow image, converted to RGB (``channels=3``) or L (``channels=1``)."""
    pixels = np.asarray(img.convert(_mode(channels)))
    return pixels.reshape(pixels.shape[0], pixels.shape[1], channels)


def decode_image(data: bytes, channels: int) -> np.ndarray:
    """The :func:`image_pixels` of an encoded image (PNG/JPEG bytes), opened by
    :func:`raydist.data.image_bytes.open_image` (an image over the pixel limit is a RaydistDataError)."""
    _mode(channels)
    with open_image(data) as img:
        return image_pixels(img, channels)


def decode_images(column: Sequence[bytes], channels: int) -> np.ndarray:
    """A 1-D object array of :func:`decode_image` arrays, one per row (images may differ in size): the decoded
    cache of an in-memory split, which :class:`ImageTransform` accepts in place of the bytes."""
    out = np.empty(len(column), dtype=object)
    for i, data in enumerate(column):
        out[i] = decode_image(data, channels)
    return out


def default_mean_std(channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """ImageNet's per-channel mean and std for RGB; 0.5 and 0.5 for greyscale."""
    return (IMAGENET_MEAN, IMAGENET_STD) if _mode(channels) == "RGB" else (GREY_MEAN, GREY_STD)


def normalize(pixels: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """H×W×C uint8 → C×H×W float32 ``(x / 255 − mean_c) / std_c``."""
    x = pixels.astype(np.float32) / np.float32(255.0)
    x = (x - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def normalize_views(views: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """B×C×H×W uint8 → float32 ``(x / 255 − mean_c) / std_c``: the same float32 operations as :func:`normalize`,
    so the same values, on a whole batch at once, in place in one float32 array (a fifth of the time of the
    same operations with a new array per operation: 3 vs 15 ms per 128 views of 64², bit for bit equal)."""
    x = views.astype(np.float32)
    m, s = (np.asarray(v, dtype=np.float32).reshape(1, -1, 1, 1) for v in (mean, std))
    np.divide(x, np.float32(255.0), out=x)
    np.subtract(x, m, out=x)
    return np.divide(x, s, out=x)


def view_rng(seed: int, epoch: int, sample_id: int) -> np.random.Generator:
    """The generator of one row's train view in one epoch: a pure function of (seed, epoch, sample_id), all
    non-negative."""
    return np.random.default_rng([seed, epoch, sample_id])


def random_resized_crop_box(
    height: int,
    width: int,
    rng: np.random.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """(top, left, h, w) of a random crop (Szegedy et al. 2015, "Inception" augmentation, as torchvision's
    RandomResizedCrop draws it): up to 10 tries of an area fraction ~ U(scale) and an aspect ratio w/h whose log
    is ~ U(log ratio); a try whose w = round(√(A·r)), h = round(√(A/r)) fits is placed uniformly. When none
    fits, the centre crop of the whole image with its aspect ratio clamped to ``ratio``."""
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    if width / height < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif width / height > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def _resize(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """Pillow's (antialiased) bilinear resize of H×W×C uint8 pixels to ``height``×``width``."""
    channels = pixels.shape[2]
    img = Image.fromarray(pixels[:, :, 0] if channels == 1 else pixels)
    out = np.asarray(img.resize((width, height), Image.Resampling.BILINEAR))
    return out.reshape(height, width, channels)


def train_view(
    pixels: np.ndarray,
    size: int,
    rng: np.random.Generator,
    *,
    flip: bool,
    mean: Sequence[float],
    std: Sequence[float],
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    uint8: bool = False,
) -> np.ndarray:
    """A random resized crop of H×W×C uint8 ``pixels`` (:func:`random_resized_crop_box`, drawn first), resized
    bilinearly to ``size``×``size``, mirrored left–right when ``flip`` and a fair coin (drawn next) says so,
    then normalised (:func:`normalize`): float32 C×size×size. ``uint8``: not normalised, uint8 C×size×size
    (:func:`normalize_views` later gives the same floats)."""
    top, left, h, w = random_resized_crop_box(pixels.shape[0], pixels.shape[1], rng, scale, ratio)
    out = _resize(pixels[top : top + h, left : left + w], size, size)
    if flip and rng.random() < 0.5:
        out = out[:, ::-1]
    return np.ascontiguousarray(out.transpose(2, 0, 1)) if uint8 else normalize(out, mean, std)


CROPS = (
    "resized",
    "pad",
    "none",
)  # a train view's crop: random resized, pad-and-crop, or none (resize + centre)


def pad_crop_offsets(pad: int, rng: np.random.Generator) -> tuple[int, int]:
    """(top, left) of a ``size``² window in an image padded by ``pad`` on every side, each uniform on
    0 … 2·pad (torchvision's ``RandomCrop(size, padding=pad)`` draws the same): a shift of at most ``pad``."""
    top, left = rng.integers(0, 2 * pad + 1, size=2)
    return int(top), int(left)


def pad_crop_view(
    pixels: np.ndarray,
    shape: tuple[int, int],
    rng: np.random.Generator,
    *,
    pad: int,
    flip: bool,
) -> np.ndarray:
    """The CIFAR recipe (He et al. 2016, §4.2): the image at ``shape`` = (height, width) (:func:`resize_centre`),
    zero-padded by ``pad`` pixels on each side, a random ``shape`` window of it (:func:`pad_crop_offsets`, drawn
    first), mirrored left–right when ``flip`` and a fair coin (drawn next) say so: uint8 height×width×C. Nothing
    is resized after the crop, so strokes keep their width; at most ``pad`` pixels of the image leave the window."""
    height, width = shape
    base = resize_centre(pixels, shape, 1.0)
    top, left = pad_crop_offsets(pad, rng)
    padded = np.pad(base, ((pad, pad), (pad, pad), (0, 0)))
    out = padded[top : top + height, left : left + width]
    return out[:, ::-1] if flip and rng.random() < 0.5 else out


def resize_centre(pixels: np.ndarray, shape: int | tuple[int, int], crop_fraction: float) -> np.ndarray:
    """The image scaled bilinearly so that it covers ``shape`` / ``crop_fraction`` (for a square ``size``: the
    shorter side to ``round(size / crop_fraction)``, the longer side in proportion, truncated), then the centre
    ``shape`` crop (offsets rounded): uint8 height×width×C. An image already of ``shape`` with ``crop_fraction``
    1 comes back as it is."""
    out_h, out_w = view_shape(shape)
    height, width = pixels.shape[:2]
    if out_h * width >= out_w * height:  # the height binds
        new_h = round(out_h / crop_fraction)
        new_w = max(int(new_h * width / height), out_w)
    else:
        new_w = round(out_w / crop_fraction)
        new_h = max(int(new_w * height / width), out_h)
    resized = pixels if (new_h, new_w) == (height, width) else _resize(pixels, new_w, new_h)
    top, left = round((new_h - out_h) / 2), round((new_w - out_w) / 2)
    return resized[top : top + out_h, left : left + out_w]


def view_shape(size: int | Sequence[int]) -> tuple[int, int]:
    """(height, width) of a view: ``size``² for an int, else the pair."""
    if isinstance(size, (int, np.integer)):
        return int(size), int(size)
    height, width = size
    return int(height), int(width)


def eval_view(
    pixels: np.ndarray,
    size: int | tuple[int, int],
    *,
    mean: Sequence[float],
    std: Sequence[float],
    crop_fraction: float = 0.875,
) -> np.ndarray:
    """:func:`resize_centre` of the image, normalised. Deterministic."""
    return normalize(resize_centre(pixels, size, crop_fraction), mean, std)


@dataclass(frozen=True)
class ImageTransform:
    """A picklable batch callable for Ray Data ``map_batches`` (or an in-memory split): replaces the ``column``
    of encoded images (object array of bytes, or of decoded arrays from :func:`decode_images`) by float32
    [B, channels, size, size] views; the other columns pass through. Train views draw from
    :func:`view_rng` (seed, epoch, the row's ``sample_id``), so any batch split gives the same pixels.

    The epoch of a pass: ``transform.for_epoch(e)`` (a copy), or ``fn_kwargs={"epoch": e}`` in ``map_batches``.
    ``crop`` (train views): ``"resized"`` (:func:`train_view`, with ``scale`` and ``ratio``), ``"pad"``
    (:func:`pad_crop_view`, a shift of at most ``pad`` pixels) or ``"none"`` (:func:`resize_centre` of the whole
    image); then the flip. ``mean``/``std`` default to :func:`default_mean_std`; eval views ignore seed, epoch,
    crop, pad, flip, scale, ratio.
    ``uint8`` (train views): the views before normalising, uint8 (a quarter of the bytes to move between
    processes); :meth:`normalize_batch` finishes them.
    """

    size: int | tuple[int, int]  # a square side, or (height, width) ("pad"/"none" crops and eval views)
    channels: int
    train: bool
    flip: bool
    seed: int
    mean: Sequence[float] | None = None
    std: Sequence[float] | None = None
    column: str = "image"
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    crop_fraction: float = 0.875
    epoch: int = 0
    uint8: bool = False
    crop: str = "resized"
    pad: int = 0

    def __post_init__(self) -> None:
        default_mean, default_std = default_mean_std(self.channels)
        mean = tuple(float(m) for m in (default_mean if self.mean is None else self.mean))
        std = tuple(float(s) for s in (default_std if self.std is None else self.std))
        if len(mean) != self.channels or len(std) != self.channels or min(std) <= 0:
            raise ValueError(f"mean {mean} and std {std} need {self.channels} values each, std > 0")
        if min(view_shape(self.size)) < 1:
            raise ValueError(f"size must be positive, got {self.size}")
        if self.train and self.crop == "resized" and len(set(view_shape(self.size))) != 1:
            raise ValueError(f"a random resized crop is square: size must be one side, got {self.size}")
        if not 0 < self.scale[0] <= self.scale[1] <= 1 or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(
                f"need 0 < scale[0] <= scale[1] <= 1 and 0 < ratio[0] <= ratio[1], "
                f"got scale={self.scale}, ratio={self.ratio}"
            )
        if self.crop not in CROPS or self.pad < 0 or (self.crop == "pad") != (self.pad > 0):
            raise ValueError(
                f"crop must be one of {CROPS} and pad > 0 exactly when crop is 'pad', got crop="
                f"{self.crop!r}, pad={self.pad}"
            )
        if not 0 < self.crop_fraction <= 1:
            raise ValueError(f"crop_fraction must be in (0, 1], got {self.crop_fraction}")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)

    def for_epoch(self, epoch: int) -> ImageTransform:
        """This transform for the pass of ``epoch``."""
        return replace(self, epoch=epoch)

    def view(self, image: bytes | np.ndarray, sample_id: int, epoch: int) -> np.ndarray:
        """One row's float32 C×size×size view, from its bytes or its decoded H×W×C pixels."""
        pixels = image if isinstance(image, np.ndarray) else decode_image(image, self.channels)
        if not self.train:
            return eval_view(
                pixels, self.size, mean=self.mean, std=self.std, crop_fraction=self.crop_fraction
            )
        rng = view_rng(self.seed, epoch, sample_id)
        if self.crop == "resized":
            return train_view(
                pixels,
                self.size,
                rng,
                flip=self.flip,
                mean=self.mean,
                std=self.std,
                scale=self.scale,
                ratio=self.ratio,
                uint8=self.uint8,
            )
        if self.crop == "pad":
            out = pad_crop_view(pixels, view_shape(self.size), rng, pad=self.pad, flip=self.flip)
        else:
            out = resize_centre(pixels, self.size, 1.0)
            out = out[:, ::-1] if self.flip and rng.random() < 0.5 else out
        return (
            np.ascontiguousarray(out.transpose(2, 0, 1))
            if self.uint8
            else normalize(out, self.mean, self.std)
        )

    def normalize_batch(self, views: np.ndarray) -> np.ndarray:
        """uint8 [B, C, S, S] train views (``uint8=True``) → the float32 views ``uint8=False`` makes."""
        return normalize_views(views, self.mean, self.std)

    def __call__(self, batch: Batch, epoch: int | None = None) -> Batch:
        """``batch`` with its image column replaced by the views of ``epoch`` (default: ``self.epoch``)."""
        images = batch[self.column]
        if self.train and "sample_id" not in batch:
            raise KeyError(f"train views need the 'sample_id' column; the batch has {sorted(batch)}")
        ids = batch["sample_id"] if self.train else np.zeros(len(images), dtype=np.int64)
        epoch = self.epoch if epoch is None else epoch
        dtype = np.uint8 if self.uint8 and self.train else np.float32
        out = np.empty((len(images), self.channels, *view_shape(self.size)), dtype=dtype)
        for i, (image, sample_id) in enumerate(zip(images, ids, strict=False)):
            out[i] = self.view(image, int(sample_id), epoch)
        return {**batch, self.column: out}
