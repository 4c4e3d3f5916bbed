"""Contrastive losses of image–caption pairs over the gathered batch (docs/algorithms.md#contrastive-losses): CLIP's
symmetric InfoNCE and SigLIP's pairwise sigmoid loss, each with a learnable, log-parameterised logit scale
(:class:`LogitScale`; SigLIP's also a learnable bias). What ``loss.kind=infonce`` and ``loss.kind=siglip``
(:mod:`raydist.losses.kinds.contrastive`) compute.

Rank r scores its own queries against the keys of all ranks (gathered with autograd) and returns
``W · total_r / (global count)`` (:func:`raydist.losses.world_mean`), so that after the gather's backward and
DDP's average the gradients of the encoders, the scale and the bias are those of one process on the concatenated
batch. A key sharing the query's image id, other than its own pair, is neither its positive nor a negative.
SigLIP walks the keys in blocks (:class:`SigmoidPairs`): its score matrix is never formed whole, in the forward
or the backward.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from raydist.distributed import GatheredBatch
from raydist.losses.inputs import world_mean


class LogitScale(nn.Module):
    """The learnable logit scale ``t = exp(t')`` (``log_scale`` = t', initialised to ``log scale``) and, for
    SigLIP, the bias ``b`` (``bias``); frozen at their initial values when ``learn`` is False."""

    def __init__(self, scale: float, bias: float | None = None, *, learn: bool = True) -> None:
        super().__init__()
        self.log_scale = nn.Parameter(torch.tensor(math.log(scale)), requires_grad=learn)
        if bias is not None:
            self.bias = nn.Parameter(torch.tensor(float(bias)), requires_grad=learn)


def _masked(batch: GatheredBatch, ids: str, key_ids: Tensor) -> Tensor:
    """[rows, keys]: the gathered keys sharing a row's image id that are not its own pair."""
    own = batch.positions[:, None] == batch.key_positions[None, :]
    return (batch.local[ids][:, None] == key_ids[None, :]) & ~own


def infonce_loss(
    batch: GatheredBatch,
    *,
    log_scale: Tensor,
    ids: str = "image_id",
    extra_keys: dict[str, Tensor] | None = None,
    stats: dict[str, float] | None = None,
) -> Tensor:
    """This rank's share of CLIP's symmetric InfoNCE (Radford et al. 2021):
    ``L = (1/2N) Σ_k [−log softmax_l(t·S_kl)[k] − log softmax_l(t·S_lk)[k]]`` over the N queries of all ranks,
    ``S = img · capᵀ`` of unit rows, ``t = exp(log_scale)``, the keys sharing a query's image id (other than its
    pair) left out of its softmax. ``extra_keys`` (``img``, ``cap`` and ``ids`` rows, no positions: the loss
    memory's) join every query's softmax as negatives, masked by image id the same way."""
    scale = log_scale.exp()
    img, cap = batch.local["img"], batch.local["cap"]
    key_img, key_cap, key_ids = batch.keys["img"], batch.keys["cap"], batch.keys[ids]
    masked = _masked(batch, ids, key_ids)
    if extra_keys is not None:
        key_img, key_cap = torch.cat([key_img, extra_keys["img"]]), torch.cat([key_cap, extra_keys["cap"]])
        masked = torch.cat([masked, batch.local[ids][:, None] == extra_keys[ids][None, :]], 1)
    scale = scale.to(img.dtype)
    i2t = (scale * (img @ key_cap.T)).masked_fill(masked, -torch.inf)
    t2i = (scale * (cap @ key_img.T)).masked_fill(masked, -torch.inf)
    positive = scale * (img * cap).sum(1)
    terms = (i2t.logsumexp(1) - positive) + (t2i.logsumexp(1) - positive)
    if stats is not None:
        stats["contrastive/scale"] = float(scale.detach())
        stats["contrastive/positive_sim"] = float((img * cap).sum(1).mean().detach())
    return world_mean(terms.sum() / 2, terms.numel(), batch)


class SigmoidPairs(torch.autograd.Function):
    """``Σ_{q,k} w_qk · softplus(−z_qk (t·q·k + b))`` over query rows ``queries`` [Q, D] and key rows ``keys``
    [K, D], with ``z_qk`` = +1 for a query's own pair and −1 otherwise, ``w_qk`` = 0 for a masked pair (same
    image id, not its own), else 1. The keys are walked ``block`` rows at a time, in the forward without a graph
    and again in the backward, so at most a [Q, block] piece of the score matrix exists at any time. Gradients
    for the queries, the keys, t and b (``d softplus(−z u)/du = −z σ(−z u)``)."""

    @staticmethod
    def forward(
        ctx,
        queries: Tensor,
        keys: Tensor,
        scale: Tensor,
        bias: Tensor,
        query_pos: Tensor,
        query_ids: Tensor,
        key_pos: Tensor,
        key_ids: Tensor,
        block: int,
    ) -> Tensor:
        inputs = (queries, keys, scale, bias, query_pos, query_ids, key_pos, key_ids)
        ctx.save_for_backward(*inputs)
        ctx.block = block
        total = queries.new_zeros(())
        for _, u, z, w in _sigmoid_blocks(inputs, block):
            total = total + (F.softplus(-z * u) * w).sum()
        return total

    @staticmethod
    def backward(ctx, grad_total: Tensor):
        queries, keys, scale, bias = ctx.saved_tensors[:4]
        grad_q, grad_k = torch.zeros_like(queries), torch.zeros_like(keys)
        grad_t, grad_b = queries.new_zeros(()), queries.new_zeros(())
        for span, u, z, w in _sigmoid_blocks(ctx.saved_tensors, ctx.block):
            g = grad_total * w * (-z) * torch.sigmoid(-z * u)  # dL/du
            grad_q += scale * (g @ keys[span])
            grad_k[span] = scale * (g.T @ queries)
            grad_t += (g * (queries @ keys[span].T)).sum()
            grad_b += g.sum()
        return grad_q, grad_k, grad_t.to(scale.dtype), grad_b.to(bias.dtype), None, None, None, None, None


def _sigmoid_blocks(saved: tuple[Tensor, ...], block: int) -> Iterator[tuple[slice, Tensor, Tensor, Tensor]]:
    """``(keys, u, z, w)`` for each ``block`` of keys of :class:`SigmoidPairs`' inputs ``saved``: the block's slice,
    logits ``t·S + b``, labels ±1 and pair weights 0/1."""
    queries, keys, scale, bias, query_pos, query_ids, key_pos, key_ids = saved
    for start in range(0, keys.shape[0], block):
        span = slice(start, start + block)
        u = scale * (queries @ keys[span].T) + bias
        own = query_pos[:, None] == key_pos[None, span]
        same = query_ids[:, None] == key_ids[None, span]
        yield span, u, own.to(u.dtype) * 2 - 1, (own | ~same).to(u.dtype)


def siglip_loss(
    batch: GatheredBatch,
    *,
    log_scale: Tensor,
    bias: Tensor,
    ids: str = "image_id",
    block: int | None = None,
    stats: dict[str, float] | None = None,
) -> Tensor:
    """This rank's share of SigLIP's sigmoid loss (Zhai et al. 2023, Algorithm 1):
    ``L = (1/N) Σ_k Σ_l −log σ(z_kl (t·S_kl + b))`` over the N images of all ranks and the captions of all ranks
    (``z_kl`` = 1 for a pair, −1 otherwise; a caption of the same image that is not its pair is left out),
    ``t = exp(log_scale)``. Rank r sums its own images' rows, walking the gathered captions ``block`` keys at a
    time (default: one rank's rows, the paper's chunk per device; :class:`SigmoidPairs`)."""
    img = batch.local["img"]
    scale, b = log_scale.exp().to(img.dtype), bias.to(img.dtype)
    total = SigmoidPairs.apply(
        img,
        batch.keys["cap"],
        scale,
        b,
        batch.positions,
        batch.local[ids],
        batch.key_positions,
        batch.keys[ids],
        block or batch.rows,
    )
    if stats is not None:
        stats["contrastive/scale"] = float(scale.detach())
        stats["contrastive/bias"] = float(b.detach())
        stats["contrastive/positive_sim"] = float((img * batch.local["cap"]).sum(1).mean().detach())
    return world_mean(total, img.shape[0], batch)
