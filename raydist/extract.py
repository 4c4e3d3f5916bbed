"""Feature extraction (`raydist embed`): an image encoder's outputs over every split of an encoded-image
dataset, written as a precomputed-feature dataset -- the VSE++ "precomp" route, produced from images.

The encoder is a trained checkpoint's (its backbone, or its whole image encoder up to the projection head) or
a named, pretrained, not fine-tuned one (``model.image_encoder`` names, weights from a local file). Images are
seen as evaluation sees them: resize + centre crop to the crop size, normalised. Captions, labels and the
word vocabulary (and a subword tokenizer) carry over unchanged; an image–caption dataset becomes one row per
caption, each image's vector stored once per caption row as the feature format has it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

from raydist.config import ConfigError
from raydist.console import say
from raydist.data.image_transforms import ImageTransform
from raydist.data.manifest import Manifest, load_manifest
from raydist.data.schema import CAPTIONS, CLEAN_LABEL, IMAGE, IMAGE_ID, LABEL, SAMPLE_ID, SPLITS
from raydist.data.shards import DatasetWriter
from raydist.data.stream import split_columns
from raydist.data.tokenizer import SubwordTokenizer, save_dataset_tokenizer
from raydist.data.transforms import ImageViews
from raydist.data.vocab import Vocab
from raydist.models.image_encoders import BackboneEncoder, build_image_encoder
from raydist.retrieval.trained import load_trained
from raydist.tasks.images import MAX_DEFAULT_SIZE, embed_views, image_transform

Output = Literal["backbone", "head"]


@dataclass
class ExtractionEncoder:
    """What maps eval views to feature vectors, the views' transform, and a description for the manifest."""

    module: nn.Module
    transform: ImageTransform
    source: dict[str, object]


def _backbone_encoder(model: nn.Module, where: str) -> BackboneEncoder:
    found = [m for m in model.modules() if isinstance(m, BackboneEncoder)]
    if len(found) != 1:
        raise ConfigError(f"{where}: expected one image encoder in the model, found {len(found)}")
    return found[0]


def checkpoint_encoder(
    checkpoint: str | Path, data_dir: str | Path, *, output: Output = "backbone", latest: bool = False
) -> ExtractionEncoder:
    """A trained checkpoint's image encoder on ``data_dir`` (checked to fit it): its backbone (``output=
    "backbone"``) or backbone + projection head, unnormalised (``"head"``), with the run's eval transform."""
    trained = load_trained(checkpoint, data_dir, latest=latest)
    if not trained.data_info.encoded:
        raise ConfigError(
            f"checkpoint {trained.checkpoint_path} was trained on precomputed features, not images: "
            "there is no image encoder to extract features with"
        )
    encoder = _backbone_encoder(trained.model, str(trained.checkpoint_path))
    module = encoder.backbone if output == "backbone" else encoder
    transform = image_transform(trained.config, trained.data_info, train=False)
    return ExtractionEncoder(
        module,
        transform,
        {"checkpoint": str(trained.checkpoint_path), "image_encoder": trained.config.model.image_encoder},
    )


def pretrained_encoder(
    name: str, manifest: Manifest, *, weights: str | Path | None = None, image_size: int | None = None
) -> ExtractionEncoder:
    """The backbone of the image encoder ``name`` (weights from a local file, else as the builder
    initialises them), for the dataset's channels, crop ``image_size`` (default: the median image's shorter
    side, at most 224)."""
    size = image_size or min(min(manifest.image_size or [MAX_DEFAULT_SIZE]), MAX_DEFAULT_SIZE)
    channels = manifest.image_channels or 3
    encoder = build_image_encoder(name, 1, channels=channels, image_size=size, weights=weights)
    transform = ImageTransform(size=size, channels=channels, train=False, flip=False, seed=0)
    return ExtractionEncoder(
        encoder.backbone,
        transform,
        {"image_encoder": name, "image_weights": str(weights) if weights else None},
    )


def extract_features(
    data_dir: str | Path,
    out_dir: str | Path,
    encoder: ExtractionEncoder,
    *,
    batch_size: int = 128,
    device: torch.device | str = "cpu",
    overwrite: bool = False,
    progress: Callable[..., None] = say,
) -> Manifest:
    """Every split of the encoded-image dataset ``data_dir`` through ``encoder`` (eval mode, no gradients)
    into a feature dataset at ``out_dir`` (float32); nothing is written when a split fails."""
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    manifest = load_manifest(data_dir)
    if manifest.image_format != "encoded":
        raise ConfigError(
            f"{data_dir}: the dataset already holds feature vectors (image_format "
            f"{manifest.image_format!r}); `raydist embed` reads encoded images"
        )
    pairs = manifest.task == "pairs"
    module = encoder.module.to(device)
    source = {"kind": "embed", "from": str(data_dir.resolve()), **encoder.source}
    with DatasetWriter(
        out_dir, task=manifest.task, num_classes=manifest.num_classes, source=source, overwrite=overwrite
    ) as writer:
        if pairs:
            writer.vocab = Vocab.load(data_dir / manifest.vocab)
        writer.class_names = manifest.class_names
        first_sample = 0
        for split in SPLITS:
            extra = (
                (CAPTIONS,)
                if pairs
                else (LABEL, *((CLEAN_LABEL,) if _has(data_dir, split, CLEAN_LABEL) else ()))
            )
            cols = split_columns(data_dir, split, (IMAGE_ID, SAMPLE_ID, IMAGE, *extra))
            started = time.perf_counter()
            views = ImageViews(cols[IMAGE], encoder.transform)
            feats = embed_views(module, views, batch_size=batch_size, device=device).reshape(len(views), -1)
            feats = feats.numpy().astype(np.float32)
            if not np.isfinite(feats).all():
                raise ConfigError(f"{data_dir} split {split!r}: the encoder produced non-finite features")
            seconds = time.perf_counter() - started
            progress(
                f"[raydist] embed {split}: {len(views)} images → {feats.shape[1]}-d features in "
                f"{seconds:.1f} s ({len(views) / max(seconds, 1e-9):.0f} images/s)"
            )
            if pairs:
                counts = np.array([len(c) for c in cols[CAPTIONS]])
                rows = int(counts.sum())
                writer.add_split(
                    split,
                    np.repeat(cols[IMAGE_ID], counts),
                    first_sample + np.arange(rows),
                    feats,
                    [c for caps in cols[CAPTIONS] for c in caps],
                    feature_index=np.repeat(np.arange(len(counts)), counts),
                )
                first_sample += rows
            else:
                writer.add_split(
                    split,
                    cols[IMAGE_ID],
                    cols[SAMPLE_ID],
                    feats,
                    labels=cols[LABEL],
                    clean_labels=cols.get(CLEAN_LABEL),
                )
    if manifest.tokenizer:
        save_dataset_tokenizer(out_dir, SubwordTokenizer.load(data_dir / manifest.tokenizer))
    return load_manifest(out_dir)


def _has(data_dir: Path, split: str, column: str) -> bool:
    """Whether the split's shards hold ``column``."""
    from raydist.data.shards import split_files
    from raydist.data.webdataset import shard_columns

    return column in shard_columns(split_files(data_dir, split)[0])
