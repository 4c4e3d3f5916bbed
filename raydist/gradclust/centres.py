"""Rank-1 cluster centres ``C_k = d_k c_kᵀ`` of one layer: exact distances to per-example gradients from
their factors, the A-step, and the least-squares factor updates of the U-step (DESIGN.md §4).

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
    cross = sum(t.cross for t in terms).double().mul_(-2)
    cross += sum(t.grad_sq for t in terms).double().unsqueeze(1)
    cross += centre_sq
    return cross.clamp_min_(0)


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
