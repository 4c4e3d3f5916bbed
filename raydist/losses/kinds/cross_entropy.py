"""``loss.kind=cross_entropy`` (task labels, its default): the cross-entropy of the class head, the mean over
this rank's rows (DDP's average over ranks is the global-batch mean); with ``model.nesting``, the Matryoshka
sum over the head's per-prefix logits (MRL / MRL-E)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from raydist.losses.kinds.base import LossKind, register_loss

if TYPE_CHECKING:
    from torch import Tensor

    from raydist.losses.inputs import LossInputs


def head_cross_entropy(inputs: LossInputs) -> Tensor:
    """The cross-entropy of the head's logits for this prefix (``extras["logits"]``) against this rank's
    ``label`` rows, in float32 (as the labels task always trained it)."""
    import torch.nn.functional as F

    return F.cross_entropy(inputs.extras["logits"].float(), inputs.batch.local["label"])


@register_loss
class CrossEntropyLoss(LossKind):
    """Cross-entropy of the class head (trains the encoder and the head; no gather)."""

    name = "cross_entropy"
    task = "labels"
    gathers = False
    per_example = True
    trains_head = True

    def loss(self, inputs: LossInputs) -> Tensor:
        return head_cross_entropy(inputs)
