"""Rank-1 cluster centres ``C_k = d_k c_kᵀ`` of one layer: exact distances to per-example gradients from
their factors, the A-step, and the least-squares factor updates of the U-step
(docs/algorithms.md#per-layer-distances, #a-step, #u-step).

Every layer kind keeps rank-1 centres, Conv2d and Embedding included (their per-example gradients are sums
of P rank-1 terms, so a centre is not their mean): the distance costs O(B·P·K·(n_in + n_out)), where a
dense centre [n_out, n_in] would cost K extra layer forwards (``Σ_p δ_pᵀ C_k u_p``) per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from raydist.gradclust.layers import Factors


@dataclass
class RankOneCentres:
    """K centres of one layer: output factors ``d`` [K, n_out], input factors ``c`` [K, n_in]."""

    d: Tensor
    c: Tensor

    def sq_norms(self) -> Tensor:
        """``‖C_k‖² = ‖d_k‖²‖c_k‖²`` → [K]."""
        return self.d.square().sum(1) * self.c.square().sum(1)


@dataclass
class LayerTerms:
    """One layer's pieces of ``‖C_k − G_i‖²``: ``cross = Σ_p (d_k·δ_ip)(c_k·u_ip)`` [B, K], ``‖G_i‖²`` [B],
    and the projections ``δ_ip·d_k``, ``u_ip·c_k`` [B, P, K] behind the cross term."""

    cross: Tensor
    grad_sq: Tensor
    grad_proj: Tensor
    input_proj: Tensor


def layer_terms(factors: Factors, centres: RankOneCentres) -> LayerTerms:
    """The data-dependent terms of ``‖C_k − G_i‖² = ‖C_k‖² − 2·cross_ik + ‖G_i‖²`` without forming G_i."""
    grad_proj = factors.grad_proj(centres.d)
    input_proj = factors.input_proj(centres.c)
    cross = (grad_proj * input_proj).sum(1)
    return LayerTerms(cross, factors.sq_norms(), grad_proj, input_proj)


def combine(terms: list[LayerTerms], centre_sq: Tensor) -> Tensor:
    """``Σ_layers ‖C_k − g_i‖² = Σ_l ‖C_lk‖² − 2 Σ_l cross_lik + Σ_l ‖G_li‖²`` → [B, K] float64, with
    ``centre_sq = Σ_l ‖C_lk‖²``; rounding below 0 is clamped to 0."""
    return distances_from(sum(t.cross for t in terms), sum(t.grad_sq for t in terms), centre_sq)


def distances_from(cross: Tensor, grad_sq: Tensor, centre_sq: Tensor) -> Tensor:
    """``centre_sq_k − 2·cross_ik + grad_sq_i`` → [B, K] float64, clamped at 0 (the sums over layers of
    :func:`combine`)."""
    # (‖C‖² − 2·cross) + ‖G‖² in float64 (centre_sq is float64: the first sum promotes, ×−2 is exact)
    out = torch.add(centre_sq, cross, alpha=-2)
    out += grad_sq.unsqueeze(1)
    return out.clamp_min_(0)


@dataclass
class PreparedCentres:
    """One layer's centres laid out for the A-step of every batch, rebuilt only when the centres change:
    ``d_t = dᵀ`` [n_out, K] and ``c_t = cᵀ`` [n_in, K], contiguous; for a dense layer with a bias ``c_t``
    holds the input rows [n_in − 1, K] and ``c_bias`` the bias row [K] (see ``Factors.input_proj_t``)."""

    d_t: Tensor
    c_t: Tensor
    c_bias: Tensor | None = None

    @classmethod
    def of(cls, centres: RankOneCentres, bias: bool = False) -> PreparedCentres:
        c_t = centres.c.T.contiguous()
        return (
            cls(centres.d.T.contiguous(), c_t[:-1], c_t[-1]) if bias else cls(centres.d.T.contiguous(), c_t)
        )


def batch_terms(
    factors: dict[str, Factors], prepared: dict[str, PreparedCentres]
) -> tuple[Tensor, Tensor, dict[str, tuple[Tensor, Tensor]]]:
    """The per-batch pieces of :func:`squared_distances` over the layers of ``prepared``, in fewer ops than
    :func:`layer_terms` + :func:`combine`: ``(Σ_l cross_lik`` [B, K], ``Σ_l ‖G_li‖²`` [B],
    ``{layer: (δ_ip·d_k, u_ip·c_k)}`` flat [B·P, K]); the same sums, accumulated layer by layer."""
    cross: Tensor | None = None
    grad_sq: Tensor | None = None
    projections = {}
    for name, prep in prepared.items():
        f = factors[name]
        grad_proj, input_proj = f.grad_proj_t(prep.d_t), f.input_proj_t(prep.c_t, prep.c_bias)
        projections[name] = (grad_proj, input_proj)
        if f.positions == 1:  # the sum over p is the single product
            cross = grad_proj * input_proj if cross is None else torch.addcmul(cross, grad_proj, input_proj)
        else:
            term = (grad_proj * input_proj).view(f.batch_size, f.positions, -1).sum(1)
            cross = term if cross is None else cross + term
        sq = f.sq_norms()
        grad_sq = sq if grad_sq is None else grad_sq + sq
    if cross is None or grad_sq is None:
        raise ValueError("batch_terms needs at least one layer")
    return cross, grad_sq, projections


def squared_distances(factors: dict[str, Factors], centres: dict[str, RankOneCentres]) -> Tensor:
    """``‖C_k − g_i‖²`` summed over layers → [B, K] in float64."""
    centre_sq = sum(c.sq_norms().double() for c in centres.values())
    return combine([layer_terms(factors[n], centres[n]) for n in centres], centre_sq)


def assign(distances: Tensor, counts: Tensor) -> Tensor:
    """A-step ``a_i = argmin_k (N_k + 1)‖C_k − g_i‖²`` (ties: lowest k) → [B]."""
    return torch.argmin((counts + 1).unsqueeze(0) * distances, dim=1)


def picked(proj: Tensor, assignment: Tensor) -> Tensor:
    """``proj[i, p, a_i]`` → [B, P]: each example's projection onto its own cluster's factor."""
    index = assignment.view(-1, 1, 1).expand(-1, proj.shape[1], 1)
    return proj.gather(2, index).squeeze(2)


def _factor_step(old: Tensor, held_sq: Tensor, sums: Tensor, prior: Tensor, total: Tensor) -> Tensor:
    """``x' = (prior·x + S / ‖y‖²) / total`` where total > 0 and ‖y‖² > 0, else x unchanged."""
    ok = (total > 0) & (held_sq > 0)
    safe_total = torch.where(ok, total, torch.ones_like(total)).unsqueeze(1).to(old.dtype)
    safe_sq = torch.where(ok, held_sq, torch.ones_like(held_sq)).unsqueeze(1)
    new = (prior.unsqueeze(1).to(old.dtype) * old + sums / safe_sq) / safe_total
    return torch.where(ok.unsqueeze(1), new, old)


def update_input_factor(centres: RankOneCentres, sums: Tensor, prior: Tensor, total: Tensor) -> Tensor:
    """``c_k' = argmin_c prior_k‖d_k cᵀ − C_k‖² + Σ_{i∈k}‖d_k cᵀ − G_i‖²
    = (prior_k c_k + S_k/‖d_k‖²)/total_k``, with ``S_k = Σ_{i∈k} G_iᵀ d_k = Σ_{i∈k} Σ_p (d_k·δ_ip) u_ip``
    and ``total_k = prior_k + n_k``.
    """
    return _factor_step(centres.c, centres.d.square().sum(1), sums, prior, total)


def update_output_factor(centres: RankOneCentres, sums: Tensor, prior: Tensor, total: Tensor) -> Tensor:
    """``d_k' = argmin_d prior_k‖d c_kᵀ − C_k‖² + Σ_{i∈k}‖d c_kᵀ − G_i‖²
    = (prior_k d_k + S_k/‖c_k‖²)/total_k``, with ``S_k = Σ_{i∈k} G_i c_k = Σ_{i∈k} Σ_p (c_k·u_ip) δ_ip``.
    """
    return _factor_step(centres.d, centres.c.square().sum(1), sums, prior, total)
