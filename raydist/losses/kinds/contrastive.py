"""``loss.kind=infonce`` and ``loss.kind=siglip`` (task pairs): CLIP's symmetric InfoNCE and SigLIP's sigmoid loss
over the global batch of all workers, each with a learnable temperature (the logit scale ``t = exp(t')``, CLIP's
log parameterisation) and SigLIP's learnable bias. Their options are torch-free; the losses are
:func:`raydist.losses.contrastive.infonce_loss` and :func:`~raydist.losses.contrastive.siglip_loss` (imported
with torch when the loss is computed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from raydist.losses.kinds.base import LossKind, MemoryOptions, MiningOptions, register_loss

if TYPE_CHECKING:
    from torch import Tensor, nn

    from raydist.losses.inputs import LossInputs


class InfoNCEOptions(MemoryOptions, MiningOptions):
    """``loss.kind=infonce`` (task pairs)."""

    temperature_init: float = Field(0.07, gt=0)  # τ₀: the logit scale starts at 1/τ₀ (CLIP: 0.07)
    learn_temperature: bool = True  # the logit scale is a parameter (false: fixed at its initial value)


class SigLIPOptions(BaseModel):
    """``loss.kind=siglip`` (task pairs)."""

    model_config = ConfigDict(extra="forbid")

    scale_init: float = Field(10.0, gt=0)  # the logit scale t starts here (SigLIP: t' = log 10)
    bias_init: float = -10.0  # the logit bias b starts here (SigLIP: −10)
    learn_temperature: bool = True  # the logit scale and the bias are parameters (false: fixed)


class ContrastiveLoss(LossKind):
    """A contrastive loss of the pairs task with a learnable logit scale (the model's ``logit_scale``: a
    :class:`raydist.losses.contrastive.LogitScale`, averaged by DDP, stepped by the optimizer)."""

    task = "pairs"
    module_name = "logit_scale"

    def initial(self) -> tuple[float, float | None]:
        """The initial logit scale and bias (None: no bias)."""
        raise NotImplementedError

    def module(self, num_classes: int | None) -> nn.Module:
        from raydist.losses.contrastive import LogitScale

        scale, bias = self.initial()
        return LogitScale(scale, bias, learn=self.options.learn_temperature)


@register_loss
class InfoNCELoss(ContrastiveLoss):
    """CLIP's symmetric InfoNCE: each image picks its caption among the captions of all workers and each caption
    its image, by a softmax over ``t · similarity``; the mean over the global batch of the two cross-entropies,
    halved."""

    name = "infonce"
    Options = InfoNCEOptions

    def initial(self) -> tuple[float, float | None]:
        return 1 / self.options.temperature_init, None

    def loss(self, inputs: LossInputs) -> Tensor:
        from raydist.losses.contrastive import infonce_loss

        loss = infonce_loss(
            inputs.batch,
            log_scale=inputs.extras["log_scale"],
            extra_keys=self.extra_keys(inputs),
            stats=inputs.stats,
        )
        self.remember(inputs)
        return loss


@register_loss
class SigLIPLoss(ContrastiveLoss):
    """SigLIP's sigmoid loss: every (image, caption) pair of the global batch is a binary classification (its
    pair or not) of ``t · similarity + b``; summed over the pairs, divided by the global batch. The captions are
    walked one worker's block at a time: the global score matrix is never formed whole."""

    name = "siglip"
    Options = SigLIPOptions

    def initial(self) -> tuple[float, float | None]:
        return self.options.scale_init, self.options.bias_init

    def loss(self, inputs: LossInputs) -> Tensor:
        from raydist.losses.contrastive import siglip_loss

        extras = inputs.extras
        return siglip_loss(
            inputs.batch, log_scale=extras["log_scale"], bias=extras["bias"], stats=inputs.stats
        )
