"""Embed an image–caption split with a VSE model and compute its retrieval metrics, on arrays: no task, no
checkpoint (loading a checkpoint for evaluation is :mod:`raydist.retrieval.trained`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from raydist.data.tokenizer import CaptionTokenizer
from raydist.distributed.shards import map_batches
from raydist.eval.metrics import retrieval_metrics
from raydist.losses.similarity import l2_normalize


@dataclass
class SplitEmbeddings:
    """One row per image (first-appearance order), one per caption, and caption → image row."""

    images: torch.Tensor
    captions: torch.Tensor
    cap_to_img: np.ndarray
    texts: list[str] | None = None  # the caption texts, one per caption row (caption-level metrics)


def image_rows(image_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row of each image's first caption, image row of each caption), images in first-seen order."""
    _, first, inverse = np.unique(image_ids, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first[order], rank[inverse]


@torch.no_grad()
def embed_split(
    model: nn.Module,
    tokenizer: CaptionTokenizer,
    features: np.ndarray,
    captions: list[str],
    image_ids: np.ndarray,
    *,
    max_len: int,
    batch_size: int = 512,
    device: torch.device | str = "cpu",
) -> SplitEmbeddings:
    """Embed every caption and each image once; ``model`` is a :class:`raydist.models.VSEModel`."""
    first, cap_to_img = image_rows(image_ids)
    images = embed_images(model, features[first], batch_size=batch_size, device=device)
    texts = embed_captions(model, tokenizer, captions, max_len=max_len, batch_size=batch_size, device=device)
    return SplitEmbeddings(images, texts, cap_to_img, list(captions))


@torch.no_grad()
def embed_images(
    model: nn.Module, features: np.ndarray, *, batch_size: int = 512, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``model.image`` of feature rows [N, D] in eval mode, in batches (shared out over the ranks inside
    :func:`raydist.distributed.shards.sharded_batches`): [N, embed_dim] on the CPU."""
    was_training = model.training
    model.eval()
    feats = np.asarray(features)  # may be read-only (Arrow, memory-mapped): each batch is copied into torch
    out = map_batches(
        lambda s, e: model.image(torch.tensor(feats[s:e], dtype=torch.float32, device=device)).cpu(),
        len(feats),
        batch_size,
    )
    model.train(was_training)
    return out


@torch.no_grad()
def embed_captions(
    model: nn.Module,
    tokenizer: CaptionTokenizer,
    captions: Sequence[str],
    *,
    max_len: int,
    batch_size: int = 512,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``model.text`` of raw captions in eval mode, tokenised by ``tokenizer.encode_batch`` (the ids the data
    pipeline's :class:`raydist.data.transforms.CaptionTransform` feeds training), in batches (shared out over the
    ranks inside :func:`raydist.distributed.shards.sharded_batches`): [N, embed_dim]."""
    was_training = model.training
    model.eval()

    def batch(start: int, end: int) -> torch.Tensor:
        tokens, lengths = tokenizer.encode_batch(captions[start:end], max_len)
        return model.text(torch.as_tensor(tokens).to(device), torch.as_tensor(lengths)).cpu()

    out = map_batches(batch, len(captions), batch_size)
    model.train(was_training)
    return out


def split_metrics(emb: SplitEmbeddings, *, folds: int = 1, prefix_dim: int | None = None) -> dict[str, float]:
    """Retrieval metrics of an embedded split (caption-level ones from ``emb.texts``). With ``prefix_dim`` m,
    also ``min_dim_<key>`` for R@1 and rsum of the re-normalised first m dims."""
    metrics = retrieval_metrics(emb.images, emb.captions, emb.cap_to_img, folds=folds, captions=emb.texts)
    if prefix_dim:
        low = retrieval_metrics(
            l2_normalize(emb.images[:, :prefix_dim]),
            l2_normalize(emb.captions[:, :prefix_dim]),
            emb.cap_to_img,
            folds=folds,
        )
        metrics.update({f"min_dim_{k}": low[k] for k in ("i2t_r1", "t2i_r1", "rsum")})
    return metrics


def evaluate_arrays(
    model: nn.Module,
    tokenizer: CaptionTokenizer,
    arrays: tuple,
    *,
    max_len: int,
    folds: int = 1,
    batch_size: int = 512,
    device: torch.device | str = "cpu",
    prefix_dim: int | None = None,
) -> dict[str, float]:
    """Retrieval metrics of ``model`` on ``(image_ids, sample_ids, features, captions)`` arrays
    (:func:`split_metrics` of :func:`embed_split`: one embedding pass serves the full and prefix dims)."""
    image_ids, _, features, captions = arrays
    emb = embed_split(
        model, tokenizer, features, captions, image_ids, max_len=max_len, batch_size=batch_size, device=device
    )
    return split_metrics(emb, folds=folds, prefix_dim=prefix_dim)
