"""Task ``pairs``: image–caption retrieval (VSE++). Captions are tokenised in the data pipeline; the loss
is the bidirectional hinge ranking loss over negatives mined from the global batch (SH warm-up, then MH);
evaluation is the VSE++ retrieval protocol."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from raydist.config import Config, ConfigError
from raydist.data import split_arrays
from raydist.data.schema import CAPTIONS, IMAGE, IMAGE_ID, SAMPLE_ID
from raydist.data.stream import EpochTransform, split_columns
from raydist.data.tokenizer import (
    TOKENIZER_NAME,
    CaptionTokenizer,
    count_truncated,
    load_caption_tokenizer,
    train_captions,
)
from raydist.data.transforms import CaptionTransform, DecodeImages, EpochViews, ImageViews
from raydist.eval.evaluate import (
    SplitEmbeddings,
    embed_captions,
    embed_images,
    embed_split,
    image_rows,
    split_metrics,
)
from raydist.models import build_model
from raydist.models.wrapped import unwrap_model
from raydist.retrieval.sets import RetrievalSet
from raydist.tasks.base import DataInfo, Encoded, Task, smallest_prefix
from raydist.tasks.images import crop_size, embed_views, eval_images, image_transform, pixel_views


class PairsTask(Task):
    """Image–caption pairs: one row per caption, captions of an image share its ``image_id``. Encoded images:
    one row per image with the list of its ``captions``; training draws one caption per image per epoch
    (:func:`raydist.data.transforms.epoch_caption_index`), evaluation uses every caption."""

    name = "pairs"
    columns = ("image_id", "sample_id", "image", "caption")
    primary_metric = "rsum"
    default_loss = "ranking"
    config_keys = dict.fromkeys(
        (
            "data.max_caption_len",
            "model.word_dim",
            "model.num_layers",
            "model.no_imgnorm",
            "eval.folds",
            "data.tokenizer",
            "model.text_encoder",
            "model.text_layers",
            "model.text_heads",
            "model.text_width",
            "model.text_dropout",
            "model.text_pooling",
        )
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tokenizer_kind = caption_tokenizer_kind(self.cfg, self.info)
        self.tokenizer: CaptionTokenizer = load_caption_tokenizer(self.info.files, self.tokenizer_kind)
        self._splits: dict[str, tuple] = {}
        if self.info.encoded:
            self.columns = (IMAGE_ID, SAMPLE_ID, IMAGE, CAPTIONS)

    def transform(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Features as float32 [B, D]; captions as token ids padded to ``data.max_caption_len`` + lengths.
        Encoded images: decoded once (:meth:`epoch_transform` then makes each epoch's views and captions)."""
        return self.stream_transform()(batch)

    def stream_transform(self) -> CaptionTransform | DecodeImages:
        if self.info.encoded:
            return DecodeImages(self.info.image_channels or 3)
        return CaptionTransform(self.tokenizer, self.cfg.data.max_caption_len)

    def epoch_transform(self) -> EpochTransform | None:
        """Encoded images: each epoch's random views and one caption per image, tokenised."""
        if not self.info.encoded:
            return None
        return EpochViews(
            image_transform(self.cfg, self.info, train=True),
            captions=CaptionTransform(self.tokenizer, self.cfg.data.max_caption_len),
        )

    def build_model(self) -> nn.Module:
        if self.info.encoded:
            model = build_model(
                self.cfg,
                None,
                len(self.tokenizer),
                channels=self.info.image_channels or 3,
                image_size=crop_size(self.cfg, self.info),
                pad_id=self.tokenizer.pad_id,
            )
        else:
            model = build_model(
                self.cfg, self.info.feature_dim, len(self.tokenizer), pad_id=self.tokenizer.pad_id
            )
        return self.add_loss_module(model)

    def encode(self, model: nn.Module, batch: dict[str, Tensor]) -> Encoded:
        lengths = batch["lengths"]
        tokens = batch["tokens"][:, : int(lengths.max())]
        img, cap = model(batch["image"], tokens, lengths)
        return Encoded(
            {"img": img, "cap": cap},
            {"image_id": batch["image_id"], "sample_id": batch["sample_id"]},
            self.loss_fn.extras(unwrap_model(model)),
        )

    def hardest(self, epoch: int) -> bool:
        """Whether ``epoch`` runs MH (the ranking loss's phase, :meth:`raydist.losses.RankingLoss.hardest`)."""
        hardest = getattr(self.loss_fn, "hardest", None)
        return bool(hardest and hardest(epoch))

    def eval_embeddings(
        self, model: nn.Module, split: str, device: torch.device | str = "cpu"
    ) -> SplitEmbeddings:
        """Each image of the split embedded once (first-appearance order) and every caption; encoded images:
        every caption of every image, each image's eval view."""
        if self.info.encoded:
            return self.encoded_embeddings(model, split, device)[0]
        image_ids, _, features, captions = self._arrays(split)
        return embed_split(
            model,
            self.tokenizer,
            features,
            captions,
            image_ids,
            max_len=self.cfg.data.max_caption_len,
            batch_size=self.cfg.eval.batch_size,
            device=device,
        )

    def eval_metrics(self, embedded: SplitEmbeddings, split: str) -> dict[str, float]:
        """VSE++ retrieval metrics (R@1/5/10, medr, meanr, rsum); ``eval.folds`` except on val; the smallest
        Matryoshka prefix's R@1 and rsum as ``min_dim_*``."""
        folds = 1 if split == "val" else self.cfg.eval.folds
        return split_metrics(embedded, folds=folds, prefix_dim=smallest_prefix(self.cfg))

    def embed(self, model: nn.Module, split: str, device: torch.device | str = "cpu") -> RetrievalSet:
        """Two-way: captions (queries, keyed by their image's row) search the images (database, one row per
        image in first-appearance order) and the other way round."""
        if self.info.encoded:
            emb, image_ids, query_ids = self.encoded_embeddings(model, split, device)
            return RetrievalSet(
                self.name,
                "t2i",
                emb.images.numpy(),
                emb.captions.numpy(),
                np.arange(len(image_ids)),
                emb.cap_to_img,
                image_ids,
                query_ids,
                two_way=True,
                split=split,
            )
        image_ids, sample_ids, features, captions = self._arrays(split)
        emb = embed_split(
            model,
            self.tokenizer,
            features,
            captions,
            image_ids,
            max_len=self.cfg.data.max_caption_len,
            batch_size=self.cfg.eval.batch_size,
            device=device,
        )
        first, _ = image_rows(image_ids)
        return RetrievalSet(
            self.name,
            "t2i",
            emb.images.numpy(),
            emb.captions.numpy(),
            np.arange(len(first)),
            emb.cap_to_img,
            image_ids[first],
            sample_ids,
            two_way=True,
            split=split,
        )

    def embed_features(
        self, model: nn.Module, features: np.ndarray, device: torch.device | str = "cpu"
    ) -> Tensor:
        """The image side: image features [N, feature_dim] → image embeddings."""
        return embed_images(model, features, batch_size=self.cfg.eval.batch_size, device=device)

    def embed_texts(
        self, model: nn.Module, texts: Sequence[str], device: torch.device | str = "cpu"
    ) -> Tensor:
        """The caption side: raw captions tokenised with the checkpoint's tokenizer (its vocabulary: lower-cased
        words, ``<start>``/``<end>``, unknown words as ``<unk>``; or its tokenizer.json), cut at
        ``data.max_caption_len``."""
        return embed_captions(
            model,
            self.tokenizer,
            list(texts),
            max_len=self.cfg.data.max_caption_len,
            batch_size=self.cfg.eval.batch_size,
            device=device,
        )

    def embed_images(
        self, model: nn.Module, pixels: Sequence[np.ndarray], device: torch.device | str = "cpu"
    ) -> Tensor:
        """The image side of a model trained on encoded images: eval views → image embeddings."""
        views = pixel_views(self.cfg, self.info, pixels)
        return embed_views(model.image, views, batch_size=self.cfg.eval.batch_size, device=device)

    def encoded_embeddings(
        self, model: nn.Module, split: str, device: torch.device | str = "cpu"
    ) -> tuple[SplitEmbeddings, np.ndarray, np.ndarray]:
        """An encoded split embedded for evaluation: each image once (its eval view, in row order) and every
        caption (row order, then caption order), with the image's ``image_id`` per image and its
        ``sample_id`` per caption."""
        if split not in self._splits:
            cols = split_columns(self.info.data_dir, split, (IMAGE_ID, SAMPLE_ID, IMAGE, CAPTIONS))
            self._splits[split] = {**cols, IMAGE: eval_images(self.cfg, self.info, split, cols[IMAGE])}
        cols = self._splits[split]
        bs = self.cfg.eval.batch_size
        views = ImageViews(cols[IMAGE], image_transform(self.cfg, self.info, train=False))
        images = embed_views(model.image, views, batch_size=bs, device=device)
        counts = np.array([len(c) for c in cols[CAPTIONS]])
        captions = [c for caps in cols[CAPTIONS] for c in caps]
        texts = embed_captions(
            model,
            self.tokenizer,
            captions,
            max_len=self.cfg.data.max_caption_len,
            batch_size=bs,
            device=device,
        )
        cap_to_img = np.repeat(np.arange(len(counts)), counts)
        embedded = SplitEmbeddings(images, texts, cap_to_img, captions)
        return embedded, cols[IMAGE_ID], np.repeat(cols[SAMPLE_ID], counts)

    def _arrays(self, split: str) -> tuple:
        """``(image_ids, sample_ids, features, captions)`` of a split, read once."""
        if split not in self._splits:
            self._splits[split] = split_arrays(
                self.info.data_dir, split, verify=False, manifest=self.info.manifest
            )
        return self._splits[split]

    def data_notes(self) -> list[str]:
        """The tokenizer and how many train captions it cuts at ``data.max_caption_len``."""
        if self.info.data_dir is None:
            return []
        captions = list(train_captions(self.info.data_dir, manifest=self.info.manifest))
        limit = self.cfg.data.max_caption_len
        cut = count_truncated(self.tokenizer, captions, limit)
        name = "word vocab (vocab.json)" if self.tokenizer_kind == "vocab" else f"subword {TOKENIZER_NAME}"
        note = (
            f"captions: {name}, {len(self.tokenizer)} ids; {cut} of {len(captions)} train captions are longer "
            f"than data.max_caption_len={limit} tokens and are truncated"
        )
        return [note]

    def summary(self, metrics: dict[str, Any]) -> str:
        return f"val rsum {metrics['rsum']:.1f} (i2t R@1 {metrics['i2t_r1']:.1f}, t2i R@1 {metrics['t2i_r1']:.1f})"

    def history_columns(self) -> list[tuple[str, str]]:
        return [("i2t_r1", "i2t R@1"), ("t2i_r1", "t2i R@1"), ("rsum", "rsum")]


def caption_tokenizer_kind(cfg: Config, info: DataInfo) -> str:
    """``data.tokenizer`` resolved: ``auto`` is ``subword`` when the data has a tokenizer.json and the text encoder
    is not the GRU, else ``vocab``; a pretrained (``hf:``) encoder needs its subword tokenizer."""
    kind = cfg.data.tokenizer
    if kind == "auto":
        kind = "subword" if TOKENIZER_NAME in info.files and cfg.model.text_encoder != "gru" else "vocab"
    if kind == "vocab" and cfg.model.text_encoder.startswith("hf:"):
        path = cfg.model.text_encoder[3:]
        raise ConfigError(
            f"model.text_encoder={cfg.model.text_encoder} reads its own tokenizer's ids: put it in the "
            f"dataset (raydist tokenizer set --data DIR --tokenizer {path}/tokenizer.json) and use "
            "data.tokenizer=auto or subword"
        )
    return kind
