"""Whether a dataset's meaning survives a left–right flip, from what its data says: the pixels (does a mirrored
image look like the data?) and, for captions, whether they name left and right. Decides ``data.flip=auto``."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from raydist.data.image_transforms import decode_image
from raydist.data.manifest import load_manifest
from raydist.data.webdataset import read_shard

CHECK_SIDE = 16  # images are compared as CHECK_SIDE² greyscale thumbnails
MAX_REFERENCES = 2000  # train images the queries are compared with, at most
MAX_QUERIES = 500  # images (val, else the rest of train) whose mirrored and plain versions are compared
MIRROR_SHARE_OFF = 0.7  # flips off when at least this share of the mirrored queries is farther from the data
SIDE_WORDS = frozenset({"left", "right"})
SIDE_CAPTION_SHARE_OFF = 0.01  # flips off when at least this share of the captions names a side
_WORD = re.compile(r"[a-z]+")


@dataclass(frozen=True)
class MirrorVerdict:
    """Whether to flip, and why: ``farther`` is the share of mirrored queries farther from their nearest
    reference than the same queries unmirrored (≈ 0.5 when the data's distribution is mirror-symmetric, as
    photographs are; near 1 for digits or text), over ``queries`` images; ``side_captions`` the share of
    captions naming left or right (None without captions)."""

    flip: bool
    farther: float
    queries: int
    side_captions: float | None = None

    @property
    def reason(self) -> str:
        """One clause for the console line that states the choice."""
        pixels = f"mirrored images farther from the data than the originals for {self.farther:.0%} of {self.queries}"
        if self.side_captions is not None and self.side_captions >= SIDE_CAPTION_SHARE_OFF:
            return f"{self.side_captions:.1%} of captions name left or right; {pixels}"
        limit = f"{'>=' if self.farther >= MIRROR_SHARE_OFF else '<'} {MIRROR_SHARE_OFF:.0%}"
        meaning = "mirroring changes these images" if not self.flip else "the data looks the same mirrored"
        return f"{pixels} ({limit}: {meaning})"


def thumbnails(images: list[bytes], side: int = CHECK_SIDE) -> np.ndarray:
    """Encoded images → float64 [N, side²] greyscale thumbnails (bilinear), each centred and scaled to unit norm
    (a blank image stays zero)."""
    out = np.empty((len(images), side * side))
    for i, data in enumerate(images):
        pixels = decode_image(data, 1)
        small = Image.fromarray(pixels[:, :, 0]).resize((side, side), Image.Resampling.BILINEAR)
        out[i] = np.asarray(small, dtype=np.float64).ravel()
    out -= out.mean(axis=1, keepdims=True)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norms > 0, norms, 1.0)


def mirrored(thumbs: np.ndarray, side: int = CHECK_SIDE) -> np.ndarray:
    """[N, side²] thumbnails mirrored left–right."""
    return thumbs.reshape(-1, side, side)[:, :, ::-1].reshape(len(thumbs), -1)


def farther_share(queries: np.ndarray, references: np.ndarray, side: int = CHECK_SIDE) -> float:
    """The share of ``queries`` whose mirror is strictly farther (Euclidean, 1e-9 slack) from its nearest
    reference than the query itself is from its own (a mirror-symmetric image ties, and counts as not
    farther)."""

    def nearest(x: np.ndarray) -> np.ndarray:
        d2 = (x * x).sum(1)[:, None] - 2 * x @ references.T + (references * references).sum(1)[None, :]
        return np.sqrt(np.maximum(d2.min(axis=1), 0.0))

    return float(np.mean(nearest(mirrored(queries, side)) > nearest(queries) + 1e-9))


def side_caption_share(captions: list[str]) -> float:
    """The share of ``captions`` with the word "left" or "right" (lower-cased word tokens)."""
    return sum(bool(SIDE_WORDS & set(_WORD.findall(c.lower()))) for c in captions) / max(len(captions), 1)


def _column(data_dir: Path, split: str, column: str) -> list:
    manifest = load_manifest(data_dir)
    files = (
        [data_dir / shard.file for shard in manifest.splits[split].shards] if split in manifest.splits else []
    )
    return [v for f in files for v in read_shard(f, [column]).column(column).to_pylist()]


@functools.lru_cache(maxsize=16)
def mirror_verdict(data_dir: str | Path, seed: int = 0) -> MirrorVerdict:
    """:class:`MirrorVerdict` of an encoded dataset: up to :data:`MAX_QUERIES` val images (the rest of train when
    val has fewer than 50) against up to :data:`MAX_REFERENCES` train images, as thumbnails; flips are off when
    the mirrored queries are farther in at least :data:`MIRROR_SHARE_OFF` of cases or at least
    :data:`SIDE_CAPTION_SHARE_OFF` of the train captions name a side. Seeded samples; cached per folder."""
    data_dir = Path(data_dir)
    rng = np.random.default_rng(seed)
    train = _column(data_dir, "train", "image")
    order = rng.permutation(len(train))
    val = _column(data_dir, "val", "image")
    if len(val) >= 50:
        references, queries = [train[i] for i in order[:MAX_REFERENCES]], val
    else:  # hold out part of train as the queries
        cut = max(len(train) // 5, 1)
        queries, references = (
            [train[i] for i in order[:cut]],
            [train[i] for i in order[cut : cut + MAX_REFERENCES]],
        )
    queries = [queries[i] for i in np.sort(rng.permutation(len(queries))[:MAX_QUERIES])]
    share = farther_share(thumbnails(queries), thumbnails(references))
    sides = None
    if load_manifest(data_dir).task == "pairs":
        sides = side_caption_share([c for caps in _column(data_dir, "train", "captions") for c in caps])
    flip = share < MIRROR_SHARE_OFF and (sides is None or sides < SIDE_CAPTION_SHARE_OFF)
    return MirrorVerdict(flip, share, len(queries), sides)
