"""Task ``labels``: class-labelled feature vectors. An MLP encoder with an L2-normalised output and a
cross-entropy classification head; evaluation on the CLEAN labels of a split (``clean_label`` when the
dataset has one): top-1 of the head, and Recall@K, P@k, mAP@k, NMI and 1-NN of the embeddings."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raydist.data import feature_matrix, read_split
from raydist.data.schema import CLEAN_LABEL, IMAGE, LABEL
from raydist.distributed import GatheredBatch, NegativeSet
from raydist.eval.label_metrics import label_metrics
from raydist.models.mlp import LabelsModel
from raydist.tasks.base import Encoded, StepContext, Task, register_task


@register_task
class LabelsTask(Task):
    """One row per sample with ``label`` in [0, K); cross-entropy over the local rows needs no gather."""

    name = "labels"
    columns = ("sample_id", "image", "label")
    primary_metric = "top1"
    gathers = False

    def transform(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {
            "image": feature_matrix(batch["image"]),
            "label": np.asarray(batch["label"], dtype=np.int64),
            "sample_id": np.asarray(batch["sample_id"], dtype=np.int64),
        }

    def build_model(self) -> nn.Module:
        if not self.info.num_classes:
            raise ValueError("task 'labels' needs num_classes in the dataset manifest")
        m = self.cfg.model
        return LabelsModel(self.info.feature_dim, m.mlp_hidden, m.embed_dim, self.info.num_classes)

    def encode(self, model: nn.Module, batch: dict[str, Tensor]) -> Encoded:
        emb, logits = model(batch["image"].float())
        ids = {"label": batch["label"], "sample_id": batch["sample_id"]}
        return Encoded({"emb": emb}, ids, {"logits": logits})

    def loss(
        self, encoded: Encoded, gathered: GatheredBatch, negative_set: NegativeSet, ctx: StepContext,
        stats: dict[str, float],
    ) -> Tensor:  # fmt: skip
        """Mean cross-entropy of this rank's rows; DDP's average over ranks is the global-batch mean."""
        logits = encoded.extras["logits"].float()
        return F.cross_entropy(logits, encoded.ids["label"])

    @torch.no_grad()
    def embed_split(self, model: nn.Module, split: str, device: torch.device | str = "cpu"):
        """(embeddings [N, d], logits [N, K], clean labels [N]) of a split."""
        table = read_split(self.info.data_dir, split, verify=False)
        features = torch.as_tensor(feature_matrix(table.column(IMAGE)))
        labels = table.column(CLEAN_LABEL if CLEAN_LABEL in table.column_names else LABEL).to_numpy()
        was_training = model.training
        model.eval()
        bs = self.cfg.eval.batch_size
        outs = [model(features[s : s + bs].to(device)) for s in range(0, len(features), bs)]
        model.train(was_training)
        emb = torch.cat([e.cpu() for e, _ in outs])
        logits = torch.cat([lg.cpu() for _, lg in outs])
        return emb, logits, labels

    def evaluate(self, model: nn.Module, split: str, device: torch.device | str = "cpu") -> dict[str, float]:
        """``top1`` (% of the head's argmax equal to the clean label) and the embedding metrics."""
        emb, logits, labels = self.embed_split(model, split, device)
        top1 = 100.0 * float((logits.argmax(1).numpy() == labels).mean())
        metrics = label_metrics(emb.numpy(), labels, ks=tuple(self.cfg.eval.recall_at))
        return {"top1": top1, **metrics}

    def summary(self, metrics: dict) -> str:
        return f"val top-1 {metrics['top1']:.1f} (R@1 {metrics.get('r1', float('nan')):.1f})"

    def history_columns(self) -> list[tuple[str, str]]:
        return [("top1", "top-1"), ("r1", "R@1"), ("nmi", "NMI")]
