"""Encoded images (PNG or JPEG file bytes) in a dataset: the one way to open them (:func:`open_image`: the pixel
limit checked from the header, before any pixel is decoded), the full decode check with Pillow, what the manifest
records about them (channels, median size), and image files read on demand by the converters."""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from raydist.data.schema import RaydistDataError

SUPPORTED_FORMATS = {
    "PNG": "PNG",
    "JPEG": "JPEG",
    "MPO": "JPEG",
    "WEBP": "WEBP",  # what img2dataset writes with --output_format webdataset --encode_format webp
}  # Pillow's name -> ours (MPO: a camera JPEG)
GREYSCALE_BANDS = frozenset({"1", "L", "I", "F"})  # Pillow bands of a single-channel grey image
MAX_IMAGE_PIXELS = 8192 * 8192  # width x height of the largest image decoded (~200 MB as RGB pixels)


class ImageTooLargeError(RaydistDataError):
    """An image whose header claims more pixels than :data:`MAX_IMAGE_PIXELS`: refused before decoding."""


def open_image(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """A Pillow image of encoded bytes with only its header read; :class:`ImageTooLargeError` when its width ×
    height is over ``max_pixels`` (so no decompression bomb is decoded). Every decode of image bytes in raydist
    starts here (data checks, converters, the training views, the Embedder, ``/embed``)."""
    try:
        image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:  # Pillow's own check, at twice its default limit
        raise ImageTooLargeError(f"too large: more than {max_pixels:,} pixels ({e})") from e
    if image.width * image.height > max_pixels:
        raise ImageTooLargeError(
            f"too large: {image.width}×{image.height} = {image.width * image.height:,} pixels, more than "
            f"{max_pixels:,}"
        )
    return image


@dataclass(frozen=True)
class ImageInfo:
    """What a full decode found: the format (``PNG``/``JPEG``), height and width in pixels, and channels
    (1 for greyscale with or without alpha, else 3)."""

    format: str
    height: int
    width: int
    channels: int


def check_image(data: bytes) -> ImageInfo:
    """Decode ``data`` completely with Pillow (:func:`open_image`, then ``load()``); RaydistDataError saying why
    it is not a usable image: zero-size, too large, unsupported image format (PNG, JPEG or WebP only), truncated
    or corrupt."""
    if len(data) == 0:
        raise RaydistDataError("zero-size image (0 bytes)")
    try:
        image = open_image(data)
        if image.format in SUPPORTED_FORMATS:
            image.load()
    except UnidentifiedImageError as e:
        raise RaydistDataError("corrupt: not a recognisable image file") from e
    except ImageTooLargeError:
        raise
    except (
        Exception
    ) as e:  # any failure of Pillow's parsers on bad bytes (OSError, SyntaxError, ValueError ...)
        kind = "truncated" if "truncat" in str(e).lower() else "corrupt"
        raise RaydistDataError(f"{kind}: {type(e).__name__}: {e}") from e
    if image.format not in SUPPORTED_FORMATS:
        raise RaydistDataError(f"unsupported image format {image.format} (PNG, JPEG or WebP only)")
    bands = [b for b in image.getbands() if b not in ("A", "a")]
    channels = 1 if len(bands) == 1 and bands[0] in GREYSCALE_BANDS else 3
    return ImageInfo(SUPPORTED_FORMATS[image.format], image.height, image.width, channels)


def dataset_channels(infos: Iterable[ImageInfo]) -> int:
    """1 when every image is greyscale, else 3 (the manifest's ``image_channels``)."""
    return 1 if all(info.channels == 1 for info in infos) else 3


def median_size(infos: Sequence[ImageInfo]) -> list[int]:
    """``[height, width]``: per axis the lower median, an observed size (the manifest's ``image_size``)."""
    if not infos:
        raise RaydistDataError("no images to take a median size of")
    mid = (len(infos) - 1) // 2
    return [sorted(i.height for i in infos)[mid], sorted(i.width for i in infos)[mid]]


class ImageFiles:
    """The bytes of image files, read when indexed (so a writer holds one shard of images at a time).

    ``files[i]`` is the bytes of ``paths[i]``; a file that cannot be read raises RaydistDataError naming it.
    """

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> bytes:
        try:
            return self.paths[i].read_bytes()
        except OSError as e:
            raise RaydistDataError(f"{self.paths[i]}: cannot read image file: {e}") from e
