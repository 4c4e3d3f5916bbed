"""A loss for image-caption pairs in one file: the decoupled contrastive loss (DCL, Yeh et al. 2022) over the
global batch of all workers.

    raydist train --plugin dcl_loss.py --data DIR loss.kind=dcl loss.temperature=0.05

Importing this file registers ``loss.kind=dcl`` and makes ``loss.temperature`` a config key (checked with the
rest of the config, swept by Tune, saved with the run).
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, Field
from torch import Tensor

from raydist.losses import LossInputs, LossKind, register_loss, world_mean


@register_loss
class DecoupledContrastive(LossKind):
    """InfoNCE with the positive taken out of the denominator: each image of this worker scores its caption
    against the other captions of all workers, ``−s⁺/τ + log Σ_neg exp(s⁻/τ)``, and each caption its image;
    other captions of the same image are left out (neither the positive nor a negative). The mean over the
    global batch of the two terms, halved."""

    name = "dcl"  # loss.kind=dcl
    task = "pairs"  # the task it trains (batch: img, cap embeddings; image_id, sample_id ids)

    class Options(BaseModel):  # each field is a config key loss.<field>, with its type, default and bounds
        temperature: float = Field(0.1, gt=0)  # loss.temperature

    def loss(self, inputs: LossInputs) -> Tensor:
        b, tau = inputs.batch, self.options.temperature
        # [this worker's rows, all rows]: captions of the row's image, its own pair included: no negatives
        same_image = b.local["image_id"][:, None] == b.keys["image_id"][None, :]
        i2t = (b.local["img"] @ b.keys["cap"].T / tau).masked_fill(same_image, -torch.inf)
        t2i = (b.local["cap"] @ b.keys["img"].T / tau).masked_fill(same_image, -torch.inf)
        positive = (b.local["img"] * b.local["cap"]).sum(1) / tau
        terms = (i2t.logsumexp(1) - positive) + (t2i.logsumexp(1) - positive)
        if inputs.stats is not None:  # per-step statistics (the run's history and TensorBoard)
            inputs.stats["dcl/positive_sim"] = float(positive.mean().detach()) * tau
        # this worker's share of the global mean: W · Σ(own terms) / (rows of all workers); DDP averages
        return world_mean(terms.sum() / 2, len(terms), b)
