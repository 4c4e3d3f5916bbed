"""The batch transforms that run in Ray Data's tasks: the train subset and each task's shard columns → model-ready
numpy arrays. Plain numpy/pyarrow callables in a module that does not import torch, so unpickling them in a data
worker does not import it either (about 1.4 s and a few hundred MB per worker process)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from raydist.data.hashing import uniform_by_id
from raydist.data.labels_io import flip_labels
from raydist.data.shards import feature_matrix
from raydist.data.vocab import Vocab

Batch = dict[str, np.ndarray]
Transform = Callable[[Batch], Batch]


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
    their lengths; image and sample ids as int64."""

    vocab: Vocab
    max_len: int

    def __call__(self, batch: Batch) -> Batch:
        tokens, lengths = self.vocab.encode_batch(batch["caption"], self.max_len)  # vectorised for ASCII
        padded = np.zeros((len(lengths), self.max_len), dtype=np.int64)
        padded[:, : tokens.shape[1]] = tokens
        return {
            "image": feature_matrix(batch["image"]),
            "tokens": padded,
            "lengths": lengths,
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

    def __call__(self, batch: Batch) -> Batch:
        sample_ids = np.asarray(batch["sample_id"], dtype=np.int64)
        labels = np.asarray(batch["label"], dtype=np.int64)
        if self.label_noise > 0:
            labels = flip_labels(labels, sample_ids, p=self.label_noise, num_classes=self.num_classes,
                                 seed=self.noise_seed)  # fmt: skip
        return {"image": feature_matrix(batch["image"]), "label": labels, "sample_id": sample_ids}
