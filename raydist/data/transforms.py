"""The batch transforms that run in Ray Data's tasks: the train subset and each task's shard columns → model-ready
numpy arrays. Plain numpy/pyarrow callables in a module that does not import torch, so unpickling them in a data
worker does not import it either (about 1.4 s and a few hundred MB per worker process)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from raydist.data.epoch_board import EPOCH_COLUMN, EpochBoard
from raydist.data.hashing import uniform_by_id
from raydist.data.image_transforms import ImageTransform, decode_images
from raydist.data.labels_io import flip_labels
from raydist.data.shards import feature_matrix
from raydist.data.tokenizer import CaptionTokenizer

Batch = dict[str, np.ndarray]
Transform = Callable[[Batch], Batch]
EpochTransform = Callable[[Batch, int], Batch]


def train_subset(batch: Batch, fraction: float, seed: int) -> Batch:
    """The rows of ``batch`` in a ``fraction`` of the train split: an image (all its captions) or a sample
    is kept when :func:`uniform_by_id` of its ``image_id`` (else ``sample_id``) is below ``fraction``."""
    if fraction >= 1.0:
        return batch
    ids = batch["image_id"] if "image_id" in batch else batch["sample_id"]
    keep = uniform_by_id(np.asarray(ids), seed, 2) < fraction
    return {k: v[keep] for k, v in batch.items()}


def train_transform(transform: Transform, fraction: float, seed: int) -> Transform:
    """``transform`` applied to :func:`train_subset` of each batch (a picklable callable for Ray Data)."""
    return partial(_subset_then, transform, fraction, seed)


def _subset_then(transform: Transform, fraction: float, seed: int, batch: Batch) -> Batch:
    return transform(train_subset(batch, fraction, seed))


@dataclass(frozen=True)
class CaptionTransform:
    """The pairs task's columns: features as float32 [B, D]; captions as token ids padded to ``max_len`` and
    their lengths (the word vocab or a subword tokenizer, :mod:`raydist.data.tokenizer`); image and sample ids
    as int64."""

    tokenizer: CaptionTokenizer
    max_len: int

    def tokens(self, captions: Sequence[str] | np.ndarray) -> Batch:
        """``tokens`` int64 [B, max_len] (right-padded with the tokenizer's pad id) and ``lengths`` int64 [B] of
        raw captions; the attention mask is ``arange(max_len) < lengths``."""
        tokens, lengths = self.tokenizer.encode_batch(
            captions, self.max_len
        )  # the vocab's is vectorised for ASCII
        padded = np.full((len(lengths), self.max_len), self.tokenizer.pad_id, dtype=np.int64)
        padded[:, : tokens.shape[1]] = tokens
        return {"tokens": padded, "lengths": lengths}

    def __call__(self, batch: Batch) -> Batch:
        return {
            "image": feature_matrix(batch["image"]),
            **self.tokens(batch["caption"]),
            "image_id": np.asarray(batch["image_id"], dtype=np.int64),
            "sample_id": np.asarray(batch["sample_id"], dtype=np.int64),
        }


@dataclass(frozen=True)
class LabelTransform:
    """The labels task's columns: features as float32; train labels with symmetric noise ``label_noise``
    applied by sample id (:func:`flip_labels`); sample ids as int64."""

    label_noise: float
    num_classes: int
    noise_seed: int

    def labels(self, batch: Batch) -> np.ndarray:
        """The batch's train labels (int64), noise applied."""
        labels = np.asarray(batch["label"], dtype=np.int64)
        if self.label_noise > 0:
            labels = flip_labels(
                labels,
                np.asarray(batch["sample_id"], dtype=np.int64),
                p=self.label_noise,
                num_classes=self.num_classes,
                seed=self.noise_seed,
            )
        return labels

    def __call__(self, batch: Batch) -> Batch:
        return {
            "image": feature_matrix(batch["image"]),
            "label": self.labels(batch),
            "sample_id": np.asarray(batch["sample_id"], dtype=np.int64),
        }


CAPTION_STREAM = 1  # the last seed word of an image's caption draws (its crop and flip draw from view_rng)


def epoch_caption_index(seed: int, epoch: int, sample_id: int, count: int) -> int:
    """Which of an image's ``count`` captions training uses in ``epoch``: the image's captions are visited in
    cycles of ``count`` epochs, cycle c = epoch // count in the order of
    ``np.random.default_rng([seed, c, sample_id, CAPTION_STREAM]).permutation(count)``, and ``epoch`` takes its
    position ``epoch % count``. So every caption is used once in each cycle, and the draw is a pure function
    of (seed, epoch, sample_id): a resumed run, any worker and any batch split agree."""
    if count < 1:
        raise ValueError(f"sample_id {sample_id}: an image needs at least one caption, got {count}")
    if count == 1:
        return 0
    order = np.random.default_rng([seed, epoch // count, sample_id, CAPTION_STREAM]).permutation(count)
    return int(order[epoch % count])


@dataclass(frozen=True)
class DecodeImages:
    """The once-only part of an in-memory split of encoded images: the ``image`` column's bytes → decoded
    H×W×C uint8 pixels (an object array, :func:`decode_images`); the other columns pass through."""

    channels: int

    def __call__(self, batch: Batch) -> Batch:
        return {**batch, "image": decode_images(batch["image"], self.channels)}


@dataclass(frozen=True)
class EpochViews:
    """The per-epoch part for encoded images, ``(batch, epoch) → batch``: the ``image`` column (bytes or decoded
    pixels) → this epoch's float32 [B, C, S, S] views (:class:`ImageTransform`, seeded by (seed, epoch,
    sample_id)); with ``captions`` (task pairs) one caption per image chosen by :func:`epoch_caption_index`
    and tokenised; with ``labels`` (task labels) the labels, noise applied. Ids as int64."""

    images: ImageTransform
    captions: CaptionTransform | None = None
    labels: LabelTransform | None = None

    def __call__(self, batch: Batch, epoch: int) -> Batch:
        sample_ids = np.asarray(batch["sample_id"], dtype=np.int64)
        out = {"image": self.images(batch, epoch)["image"], "sample_id": sample_ids}
        if self.captions is not None:
            seed = self.images.seed
            chosen = [
                caps[epoch_caption_index(seed, epoch, int(sid), len(caps))]
                for caps, sid in zip(batch["captions"], sample_ids, strict=False)
            ]
            out.update(self.captions.tokens(np.array(chosen, dtype=object)))
            out["image_id"] = np.asarray(batch["image_id"], dtype=np.int64)
        if self.labels is not None:
            out["label"] = self.labels.labels(batch)
        return out


@dataclass(frozen=True)
class PassViews:
    """The per-epoch views (:class:`EpochViews`) made in the Ray Data tasks of a streamed split: each task reads
    its pass's epoch from ``board`` (announced by the training workers before they open the pass) and makes
    that epoch's views, captions and labels, the views as uint8 (a quarter of the float32 bytes through Ray's
    object store); the output carries the epoch in the ``epoch`` column, which the worker checks and drops
    (:class:`raydist.data.stream.StreamedEpochs`), and :meth:`finish` normalises a batch in the worker. The
    values are those of the in-memory path for the same (seed, epoch, sample_id), made in as many processes as
    the stream's tasks instead of in the worker."""

    views: EpochViews
    board: EpochBoard

    def __post_init__(self) -> None:
        object.__setattr__(self, "views", replace(self.views, images=replace(self.views.images, uint8=True)))

    def __call__(self, batch: Batch) -> Batch:
        epoch = self.board.current()
        out = self.views(batch, epoch)
        out[EPOCH_COLUMN] = np.full(len(out["sample_id"]), epoch, dtype=np.int64)
        return out

    def finish(self, batch: Batch) -> Batch:
        """A batch cut from the tasks' blocks, its uint8 views normalised (the float32 the in-memory path has)."""
        return {**batch, "image": self.views.images.normalize_batch(batch["image"])}


class ImageViews:
    """Eval views of an image column made on demand: ``views[a:b]`` is float32 [b − a, C, S, S] from
    ``transform`` (an eval :class:`ImageTransform`), so a split is never held as floats all at once."""

    def __init__(self, images: np.ndarray, transform: ImageTransform) -> None:
        self.images, self.transform = images, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, rows: slice) -> np.ndarray:
        chunk = self.images[rows]
        return self.transform({"image": chunk, "sample_id": np.zeros(len(chunk), np.int64)})["image"]
