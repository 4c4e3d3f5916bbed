"""A raydist plugin: a contrastive loss for class-labelled data and a small convolutional image encoder.

    raydist train --plugin contrastive_plugin.py --data DIR \
        model.image_encoder=tiny-conv loss.kind=contrastive loss.neg_margin=0.7

raydist imports this file in the driver before the config is checked (so ``loss.neg_margin`` is a config key)
and in every Ray process of the run; it needs to be on no import path.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, Field
from torch import Tensor, nn

from raydist.losses import LossInputs, LossKind, register_loss, world_mean
from raydist.models.image_encoders import Backbone, register_image_encoder


@register_image_encoder("tiny-conv")
def tiny_conv(*, in_dim: int | None, channels: int, image_size: int | None, width: int = 16) -> Backbone:
    """Two 3x3 convolutions, then the mean over a 2x2 grid: ``4 * width`` features (raydist adds the head)."""
    net = nn.Sequential(
        nn.Conv2d(channels, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
    )
    return Backbone(net, 4 * width)


@register_loss
class Contrastive(LossKind):
    """Hadsell et al.'s contrastive loss over the global batch of all workers: the mean over every pair
    (query row of this worker, key row of any worker) of ``[d - pos_margin]_+^2`` for two rows of one class
    (a row with itself left out) and ``[neg_margin - d]_+^2`` for rows of two classes, d the Euclidean
    distance of the unit embeddings."""

    name = "contrastive"
    task = "labels"

    class Options(BaseModel):
        pos_margin: float = Field(0.0, ge=0)  # loss.pos_margin
        neg_margin: float = Field(0.5, ge=0)  # loss.neg_margin

    def loss(self, inputs: LossInputs) -> Tensor:
        batch, opt = inputs.batch, self.options
        queries, keys = batch.local["emb"], batch.keys["emb"]
        dist = (2 - 2 * queries @ keys.T).clamp(min=1e-12).sqrt()  # unit rows: |q - k|^2 = 2 - 2 q.k
        same = batch.local["label"][:, None] == batch.keys["label"][None, :]
        positive = same & (batch.positions[:, None] != batch.key_positions[None, :])
        terms = torch.where(
            positive,
            (dist - opt.pos_margin).clamp(min=0) ** 2,
            torch.where(same, 0.0, (opt.neg_margin - dist).clamp(min=0) ** 2),
        )
        if inputs.stats is not None:  # per-step statistics, in the run's steps.jsonl and TensorBoard
            inputs.stats["contrastive/workers"] = float(batch.world)
        # this worker's share of the mean over all workers' pairs (DDP averages the gradients)
        return world_mean(terms.sum(), positive.sum() + (~same).sum(), batch)
