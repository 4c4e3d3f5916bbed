"""A loss for image-caption pairs in one file: CLIP's symmetric InfoNCE over the global batch of all workers.

    raydist train --plugin infonce_loss.py --data DIR loss.kind=infonce loss.temperature=0.05

Importing this file registers ``loss.kind=infonce`` and makes ``loss.temperature`` a config key (checked with
the rest of the config, swept by Tune, saved with the run).
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, Field
from torch import Tensor

from raydist.losses import LossInputs, LossKind, register_loss, world_mean


@register_loss
class InfoNCE(LossKind):
    """Each image of this worker picks its caption among the captions of all workers, and each caption its
    image, by a softmax over similarities / τ; other captions of the same image are left out (neither the
    positive nor a negative). The mean over the global batch of the two cross-entropies, halved."""

    name = "infonce"  # loss.kind=infonce
    task = "pairs"  # the task it trains (batch: img, cap embeddings; image_id, sample_id ids)

    class Options(BaseModel):  # each field is a config key loss.<field>, with its type, default and bounds
        temperature: float = Field(0.1, gt=0)  # loss.temperature

    def loss(self, inputs: LossInputs) -> Tensor:
        b, tau = inputs.batch, self.options.temperature
        own = b.positions[:, None] == b.key_positions[None, :]  # [this worker's rows, all rows]: the positive
        other_caption = (b.local["image_id"][:, None] == b.keys["image_id"][None, :]) & ~own
        i2t = (b.local["img"] @ b.keys["cap"].T / tau).masked_fill(other_caption, -torch.inf)
        t2i = (b.local["cap"] @ b.keys["img"].T / tau).masked_fill(other_caption, -torch.inf)
        terms = (i2t.logsumexp(1) - i2t[own]) + (t2i.logsumexp(1) - t2i[own])
        if inputs.stats is not None:  # per-step statistics (the run's history and TensorBoard)
            inputs.stats["infonce/positive_sim"] = float(i2t[own].mean().detach()) * tau
        # this worker's share of the global mean: W · Σ(own terms) / (rows of all workers); DDP averages
        return world_mean(terms.sum() / 2, len(terms), b)
