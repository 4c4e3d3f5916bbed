"""Task ``labels``: class-labelled feature vectors. An MLP encoder with an L2-normalised output and a
classification head; the loss is cross-entropy on the head (``loss.kind=cross_entropy``, the default) or a
metric loss on the embeddings mined over the global batch of all workers (``triplet`` or ``margin``, with
``loss.miner``). Evaluation on the CLEAN labels of a split (``clean_label`` when the dataset has one): top-1
of the head, and Recall@K, P@k, mAP@k, NMI and 1-NN of the embeddings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from raydist.data import feature_matrix, read_split
from raydist.data.labels_io import missing_class_notes, split_class_counts
from raydist.data.manifest import load_manifest
from raydist.data.schema import CLEAN_LABEL, IMAGE, LABEL, SAMPLE_ID
from raydist.data.stream import split_columns
from raydist.data.transforms import DecodeImages, EpochViews, ImageViews, LabelTransform
from raydist.distributed import GatheredBatch, NegativeSet
from raydist.distributed.shards import map_batches
from raydist.eval.label_metrics import label_metrics, leave_one_out_neighbours
from raydist.losses import LossInputs
from raydist.losses.kinds import head_cross_entropy
from raydist.models.image_encoders import image_encoder_from_config
from raydist.models.mlp import LabelsModel
from raydist.models.wrapped import unwrap_model
from raydist.retrieval.sets import RetrievalSet
from raydist.tasks.base import PROBE_LOSS, Encoded, StepContext, Task, smallest_prefix
from raydist.tasks.images import crop_size, eval_images, image_transform, pixel_views


class LabelsTask(Task):
    """One row per sample with ``label`` in [0, K). The loss kind (``loss.kind``: cross_entropy, triplet, margin
    or a registered labels loss) sees the rows' ``emb``, ``label`` and ``sample_id`` and the head's ``logits``;
    a kind that does not train the head (``LossKind.trains_head``) gets the head trained as a linear probe."""

    name = "labels"
    columns = ("sample_id", "image", "label")
    primary_metric = "top1"
    default_loss = "cross_entropy"
    config_keys: ClassVar[dict[str, tuple[str, ...] | None]] = {
        "data.label_noise": None,
        "data.noise_seed": None,
        "model.mlp_hidden": None,
        "eval.recall_at": None,
    }
    noisy_label_patience = 3

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.probe = not self.loss_fn.trains_head  # the head: a linear probe on detached embeddings
        self.primary_metric = "r1" if self.probe else "top1"
        self._eval_images: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def data_notes(self) -> list[str]:
        """A warning for each split that lacks classes another split shares (with the rows per split)."""
        if self.info.data_dir is None:
            return []
        manifest = self.info.manifest or load_manifest(self.info.data_dir)
        source = manifest.source or {}
        names = manifest.class_names or source.get("classes")
        return missing_class_notes(split_class_counts(self.info.data_dir, manifest=manifest), names)

    def transform(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Features as float32; train labels with ``data.label_noise`` applied (:func:`flip_labels`). Encoded
        images: decoded once (:meth:`epoch_transform` then makes each epoch's views and labels)."""
        return self.stream_transform()(batch)

    def stream_transform(self) -> LabelTransform | DecodeImages:
        if self.info.encoded:
            return DecodeImages(self.info.image_channels or 3)
        return self._labels()

    def _labels(self) -> LabelTransform:
        d = self.cfg.data
        return LabelTransform(d.label_noise, self.info.num_classes or 0, d.noise_seed)

    def epoch_transform(self) -> EpochViews | None:
        """Encoded images: each epoch's random views, labels with ``data.label_noise`` applied."""
        if not self.info.encoded:
            return None
        return EpochViews(image_transform(self.cfg, self.info, train=True), labels=self._labels())

    def build_model(self) -> nn.Module:
        if not self.info.num_classes:
            raise ValueError("task 'labels' needs num_classes in the dataset manifest")
        m = self.cfg.model
        encoder = None
        if self.info.encoded:  # model.image_encoder replaces the MLP (model.mlp_hidden is not used)
            encoder = image_encoder_from_config(
                m, channels=self.info.image_channels or 3, image_size=crop_size(self.cfg, self.info)
            )
        model = LabelsModel(
            self.info.feature_dim,
            m.mlp_hidden,
            m.embed_dim,
            self.info.num_classes,
            m.nesting,
            encoder=encoder,
        )
        return self.add_loss_module(model)  # e.g. the margin loss's β

    def encode(self, model: nn.Module, batch: dict[str, Tensor]) -> Encoded:
        emb, logits = model(batch["image"], probe=self.probe)
        ids = {"label": batch["label"], "sample_id": batch["sample_id"]}
        extras = {"logits": logits, **self.loss_fn.extras(unwrap_model(model))}
        return Encoded({"emb": emb}, ids, extras)

    def loss(
        self,
        encoded: Encoded,
        gathered: GatheredBatch,
        negative_set: NegativeSet,
        ctx: StepContext,
        stats: dict[str, float],
    ) -> Tensor:
        """The loss kind's in the Matryoshka sum (cross-entropy: the mean over this rank's rows; triplet /
        margin: mined over the global batch, this rank's anchors, exact under DDP,
        :func:`raydist.losses.rank_metric_loss`). A kind that does not train the head: plus the cross-entropy of
        the head as a linear probe on detached embeddings (so ``top1`` stays meaningful without changing the
        encoder's gradient), reported apart as ``loss/probe``."""
        inputs = LossInputs(gathered, negative_set, encoded.extras, ctx.epoch, ctx.global_step, stats)
        loss = self.nested_loss(self.loss_fn.loss, encoded, inputs)
        if not self.probe:
            return loss
        head_loss = self.nested_loss(head_cross_entropy, encoded, inputs)
        stats[PROBE_LOSS] = float(head_loss.detach())  # reported apart from the training loss
        return loss + head_loss  # the head is a linear probe on detached embeddings: no encoder gradient

    @torch.no_grad()
    def embed_split(self, model: nn.Module, split: str, device: torch.device | str = "cpu"):
        """(embeddings [N, d], logits [N, K], clean labels [N]) of a split."""
        if self.info.encoded:  # the split's labels and images (decoded once when they fit) are kept
            if split not in self._eval_images:
                table = read_split(self.info.data_dir, split, verify=False, manifest=self.info.manifest)
                images = table.column(IMAGE).to_numpy(zero_copy_only=False)
                labels = table.column(CLEAN_LABEL if CLEAN_LABEL in table.column_names else LABEL).to_numpy()
                self._eval_images[split] = (eval_images(self.cfg, self.info, split, images), labels)
            images, labels = self._eval_images[split]
            inputs = ImageViews(images, image_transform(self.cfg, self.info, train=False))
        else:
            table = read_split(self.info.data_dir, split, verify=False, manifest=self.info.manifest)
            labels = table.column(CLEAN_LABEL if CLEAN_LABEL in table.column_names else LABEL).to_numpy()
            inputs = feature_matrix(table.column(IMAGE))
        emb, logits = self._forward(model, inputs, device)
        return emb, logits, labels

    @torch.no_grad()
    def _forward(
        self, model: nn.Module, features: np.ndarray | ImageViews, device: torch.device | str
    ) -> tuple[Tensor, Tensor]:
        """(embeddings [N, d], full-dim logits [N, K]) of feature rows (or eval image views, made a batch at a
        time), in eval mode and batches (shared out over the ranks inside
        :func:`raydist.distributed.shards.sharded_batches`), on the CPU."""
        was_training = model.training
        model.eval()

        def batch(start: int, end: int) -> tuple[Tensor, Tensor]:
            emb, logits = model(
                # a copy: the rows may be a read-only array, which torch.as_tensor would share and warn about
                torch.tensor(np.asarray(features[start:end]), dtype=torch.float32, device=device)
            )
            # the full-dim logits (the largest nesting dim is last)
            return emb.cpu(), (logits[-1] if isinstance(logits, list) else logits).cpu()

        emb, logits = map_batches(batch, len(features), self.cfg.eval.batch_size)
        model.train(was_training)
        return emb, logits

    def embed_features(
        self, model: nn.Module, features: np.ndarray, device: torch.device | str = "cpu"
    ) -> Tensor:
        """Feature vectors [N, feature_dim] → the encoder's unit embeddings (the head is not used)."""
        return self._forward(model, features, device)[0]

    def embed_images(
        self, model: nn.Module, pixels: Sequence[np.ndarray], device: torch.device | str = "cpu"
    ) -> Tensor:
        """Decoded images of a model trained on encoded images → their eval views' unit embeddings."""
        return self._forward(model, pixel_views(self.cfg, self.info, pixels), device)[0]

    def eval_embeddings(
        self, model: nn.Module, split: str, device: torch.device | str = "cpu"
    ) -> tuple[Tensor, Tensor, np.ndarray]:
        """(embeddings, full-dim logits, clean labels) of a split (:meth:`embed_split`)."""
        return self.embed_split(model, split, device)

    def eval_metrics(self, embedded: tuple[Tensor, Tensor, np.ndarray], split: str) -> dict[str, float]:
        """``top1`` (% of the head's argmax equal to the clean label) and the embedding metrics."""
        emb, logits, labels = embedded
        top1 = 100.0 * float((logits.argmax(1).numpy() == labels).mean())
        metrics = label_metrics(emb.numpy(), labels, ks=tuple(self.cfg.eval.recall_at))
        low = smallest_prefix(self.cfg)
        if low:  # Recall@1 of the re-normalised smallest Matryoshka prefix
            nearest = labels[leave_one_out_neighbours(emb[:, :low].numpy(), 1)[:, 0]]
            metrics["min_dim_r1"] = 100.0 * float((nearest == labels).mean())
        return {"top1": top1, **metrics}

    def embed(self, model: nn.Module, split: str, device: torch.device | str = "cpu") -> RetrievalSet:
        """One-way: every row searches all the others (leave-one-out), keyed by its clean label."""
        emb, _, labels = self.embed_split(model, split, device)
        ids = split_columns(self.info.data_dir, split, [SAMPLE_ID])[SAMPLE_ID]
        return RetrievalSet(
            self.name,
            "knn",
            emb.numpy(),
            emb.numpy(),
            labels,
            labels,
            ids,
            ids,
            exclude_self=True,
            split=split,
        )

    def summary(self, metrics: dict) -> str:
        return f"val top-1 {metrics['top1']:.1f} (R@1 {metrics.get('r1', float('nan')):.1f})"

    def history_columns(self) -> list[tuple[str, str]]:
        return [("top1", "top-1"), ("r1", "R@1"), ("nmi", "NMI")]
