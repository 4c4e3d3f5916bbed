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

from raydist.gradclust.layers import DenseFactors, Factors


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
    :func:`combine`); ``grad_sq`` [B] or [B, 1]."""
    # (‖C‖² − 2·cross) + ‖G‖² in float64 (centre_sq is float64: the first sum promotes, ×−2 is exact)
    out = torch.add(centre_sq, cross, alpha=-2)
    out += grad_sq if grad_sq.dim() == 2 else grad_sq.unsqueeze(1)  # [B, 1] as it is, [B] as a column
    return out.clamp_min_(0)


@dataclass
class PreparedCentres:
    """One layer's centres laid out for the A-step of every batch, rebuilt only when the centres change:
    ``d_t = dᵀ`` [n_out, K] and ``c_t = cᵀ`` [n_in, K], contiguous; for a dense layer with a bias ``c_t``
    holds the input rows [n_in − 1, K] and ``c_bias`` the bias row [K] (see ``Factors.input_proj_t``).
    The stacked path of :func:`batch_terms` multiplies from the other side, by ``d`` [K, n_out] and
    ``c_main`` [K, n_in] (without the bias column, which is ``c_bias_col`` [K, 1]): views of the centres."""

    d_t: Tensor
    c_t: Tensor
    c_bias: Tensor | None = None
    d: Tensor | None = None
    c_main: Tensor | None = None
    c_bias_col: Tensor | None = None

    @classmethod
    def of(cls, centres: RankOneCentres, bias: bool = False) -> PreparedCentres:
        c, d = centres.c, centres.d
        c_t, d_t = c.T.contiguous(), d.T.contiguous()
        if bias:
            return cls(d_t, c_t[:-1], c_t[-1], d, c[:, :-1], c[:, -1:])
        return cls(d_t, c_t, None, d, c, None)


def stackable(factors: dict[str, Factors], names: list[str]) -> list[str]:
    """The layers of ``names`` whose per-step terms :func:`batch_terms` computes stacked: dense layers with one
    position (a Linear on [B, n]), all in the first such layer's dtype (else none)."""
    flat = [n for n in names if isinstance(factors[n], DenseFactors) and factors[n].positions == 1]
    if len({factors[n].flat_grads.dtype for n in flat}) > 1:
        return []
    return flat


class StackedBuffers:
    """Reused per-batch tensors of :func:`batch_terms`' stacked layers, all in one ``proj`` [2, K+1, L, B]:
    ``proj[0, k, l, i] = d_lk·δ_li`` and ``proj[1, k, l, i] = c_lk·[a_li, 1]`` for k < K (cluster-major: the
    product [K, n]·[n, B], about a third faster than [B, n]·[n, K] for small K, written in place with leading
    dimension L·B), and in the extra row k = K the squared row norms ``‖δ_li‖²`` and ``‖a_li‖² + bias_l``.
    So one product and one sum over the layers give the cross terms (rows k < K) and ‖G_i‖² (row K) together:
    ``summed = Σ_l proj[0] ∘ proj[1]`` [K+1, B]. The U-step's coefficients are ``grad_coeff`` / ``input_coeff``
    = ``proj[0|1, :K]`` [K, L, B] (``grad_coeff_flat`` [K·L, B] for the bias sums by one matrix-vector product);
    every per-layer view is made once (a view made per batch costs an op like any other). Reallocated when L,
    B, K, the dtype, the device or the bias flags change; the contents are valid until the next batch."""

    def __init__(self) -> None:
        self._key: tuple | None = None

    def prepare(
        self, like: Tensor, layers: int, rows: int, clusters: int, bias: list[bool]
    ) -> StackedBuffers:
        key = (layers, rows, clusters, like.dtype, like.device, tuple(bias))
        if key != self._key:
            self._key = key
            self.proj = like.new_empty(2, clusters + 1, layers, rows)
            self.product = like.new_empty(clusters + 1, layers, rows)
            self.summed = like.new_empty(clusters + 1, rows)
            self.norms = self.proj[:, clusters]  # [2, L, B]
            self.input_norms = self.norms[1]
            self.bias_col = like.new_tensor([float(b) for b in bias]).unsqueeze(1) if any(bias) else None
            self.grad_coeff, self.input_coeff = self.proj[0, :clusters], self.proj[1, :clusters]
            self.grad_coeff_flat = self.grad_coeff.view(clusters * layers, rows)
            self.ones = like.new_ones(rows)
            self.grad_rows, self.input_rows = self.grad_coeff.unbind(1), self.input_coeff.unbind(1)
            self.g_rows, self.a_rows = self.norms[0].unbind(0), self.norms[1].unbind(0)
            self.cross, self.grad_sq = self.summed[:clusters].T, self.summed[clusters]
            self.grad_sq_col = self.grad_sq.unsqueeze(1)
        return self


@dataclass
class BatchTerms:
    """The per-batch pieces of :func:`squared_distances`: ``cross`` = Σ_l cross_lik [B, K] (a transposed view
    when layers were stacked), ``grad_sq`` = Σ_l ‖G_li‖² [B] (or [B, 1] when layers were stacked: a view
    :func:`distances_from` adds as it is); the projections ``δ_ip·d_k`` and ``u_ip·c_k`` of the ``stacked``
    layers in ``buffers`` ([K, L, B], layer l = stacked[l]) and of the other layers per layer as flat
    [B·P, K] (``projections``)."""

    cross: Tensor
    grad_sq: Tensor
    stacked: list[str]
    buffers: StackedBuffers | None
    projections: dict[str, tuple[Tensor, Tensor]]


def _stacked_terms(
    factors: dict[str, Factors],
    prepared: dict[str, PreparedCentres],
    stacked: list[str],
    buffers: StackedBuffers | None,
) -> StackedBuffers:
    """The stacked layers' projections and squared row norms written into ``buffers.proj``, and their
    ``summed`` = Σ_l proj[0] ∘ proj[1] (cross terms and ‖G_i‖²): 4 ops per layer and 4 for all of them."""
    first = factors[stacked[0]].flat_grads
    clusters = prepared[stacked[0]].d.shape[0]
    bias = [prepared[n].c_bias is not None for n in stacked]
    buffers = (buffers or StackedBuffers()).prepare(first, len(stacked), first.shape[0], clusters, bias)
    for layer, name in enumerate(stacked):
        f, prep = factors[name], prepared[name]
        a, g = f.flat_inputs, f.flat_grads
        torch.mm(prep.d, g.T, out=buffers.grad_rows[layer])
        if prep.c_bias_col is None:
            torch.mm(prep.c_main, a.T, out=buffers.input_rows[layer])
        else:
            torch.addmm(prep.c_bias_col, prep.c_main, a.T, out=buffers.input_rows[layer])
        torch.linalg.vector_norm(g, dim=1, out=buffers.g_rows[layer])
        torch.linalg.vector_norm(a, dim=1, out=buffers.a_rows[layer])
    buffers.norms.square_()
    if buffers.bias_col is not None:
        buffers.input_norms += buffers.bias_col  # ‖[a, 1]‖² = ‖a‖² + 1
    torch.mul(buffers.proj[0], buffers.proj[1], out=buffers.product)
    torch.sum(buffers.product, 1, out=buffers.summed)
    return buffers


def batch_terms(
    factors: dict[str, Factors],
    prepared: dict[str, PreparedCentres],
    stacked: list[str] | None = None,
    buffers: StackedBuffers | None = None,
) -> BatchTerms:
    """:func:`squared_distances`'s data-dependent terms over the layers of ``prepared`` in few ops per batch.

    The layers named in ``stacked`` (see :func:`stackable`) write their two projections and their squared row
    norms into one [2, K+1, L, B] tensor (``buffers`` keeps it from batch to batch, see
    :class:`StackedBuffers`), so the cross terms and ``‖G_i‖² = (‖a_i‖² + bias)‖δ_i‖²`` of all of them are one
    product and one sum, and (in the U-step) the masked coefficients one op; the other layers are summed in
    one by one."""
    stacked = stacked or []
    cross: Tensor | None = None
    grad_sq: Tensor | None = None
    if stacked:
        buffers = _stacked_terms(factors, prepared, stacked, buffers)
        cross, grad_sq = buffers.cross, buffers.grad_sq_col
    projections = {}
    for name, prep in prepared.items():
        if name in stacked:
            continue
        f = factors[name]
        layer_grad_proj, layer_input_proj = f.grad_proj_t(prep.d_t), f.input_proj_t(prep.c_t, prep.c_bias)
        projections[name] = (layer_grad_proj, layer_input_proj)
        if f.positions == 1:  # the sum over p is the single product
            cross = (
                layer_grad_proj * layer_input_proj
                if cross is None
                else torch.addcmul(cross, layer_grad_proj, layer_input_proj)
            )
        else:
            term = (layer_grad_proj * layer_input_proj).view(f.batch_size, f.positions, -1).sum(1)
            cross = term if cross is None else cross + term
        sq = f.sq_norms()
        grad_sq = sq if grad_sq is None else (grad_sq.squeeze(1) if grad_sq.dim() == 2 else grad_sq) + sq
    if cross is None or grad_sq is None:
        raise ValueError("batch_terms needs at least one layer")
    return BatchTerms(cross, grad_sq, stacked, buffers if stacked else None, projections)


def squared_distances(factors: dict[str, Factors], centres: dict[str, RankOneCentres]) -> Tensor:
    """``‖C_k − g_i‖²`` summed over layers → [B, K] in float64."""
    return combine(
        [layer_terms(factors[n], centres[n]) for n in centres], centre_sq_norms(list(centres.values()))
    )


def assign(distances: Tensor, counts: Tensor) -> Tensor:
    """A-step ``a_i = argmin_k (N_k + 1)‖C_k − g_i‖²`` (ties: lowest k) → [B]."""
    return torch.argmin((counts + 1).unsqueeze(0) * distances, dim=1)


def picked(proj: Tensor, assignment: Tensor) -> Tensor:
    """``proj[i, p, a_i]`` → [B, P]: each example's projection onto its own cluster's factor."""
    index = assignment.view(-1, 1, 1).expand(-1, proj.shape[1], 1)
    return proj.gather(2, index).squeeze(2)


def update_factors(
    centres: list[RankOneCentres], sums: list[Tensor], prior: Tensor, total: Tensor, *, inputs: bool
) -> list[Tensor]:
    """The U-step's new input factors (``inputs``) or output factors of every layer, one held fixed:

    ``c_k' = argmin_c prior_k‖d_k cᵀ − C_k‖² + Σ_{i∈k}‖d_k cᵀ − G_i‖² = (prior_k c_k + S_k/‖d_k‖²)/total_k``
    with ``S_k = Σ_{i∈k} G_iᵀ d_k = Σ_{i∈k} Σ_p (d_k·δ_ip) u_ip``, and likewise
    ``d_k' = (prior_k d_k + S_k/‖c_k‖²)/total_k`` with ``S_k = Σ_{i∈k} Σ_p (c_k·u_ip) δ_ip``; ``total_k =
    prior_k + n_k``. A factor stays as it is where ``total_k = 0`` or the held factor is 0. ``sums``: each
    layer's S [K, n]; ``prior``, ``total`` [K] float64. The coefficients of x and S are formed for all layers
    at once (float64), so the U-step costs a few ops per layer."""
    held = torch.stack(
        [torch.linalg.vector_norm(c.d if inputs else c.c, dim=1, dtype=torch.float64) for c in centres]
    ).square_()  # [L, K]
    ok = (held > 0) & (total > 0)
    # x' = keep·x + add·S; where not ok the divisions' inf/nan are not selected
    coeff = torch.stack(
        [torch.where(ok, prior / total, 1.0), torch.where(ok, (held * total).reciprocal_(), 0.0)]
    )
    olds = [c.c if inputs else c.d for c in centres]
    keep = [k.to(x.dtype) for k, x in zip(coeff[0].unsqueeze(2), olds, strict=False)]
    add = [a.to(x.dtype) for a, x in zip(coeff[1].unsqueeze(2), olds, strict=False)]
    out = torch._foreach_mul(olds, keep)
    torch._foreach_addcmul_(out, sums, add)
    return list(out)


def centre_sq_norms(centres: list[RankOneCentres]) -> Tensor:
    """``Σ_l ‖C_lk‖² = Σ_l ‖d_lk‖²‖c_lk‖²`` → [K] float64 (:meth:`RankOneCentres.sq_norms` summed, in a few ops)."""
    norms = torch.stack(
        [torch.linalg.vector_norm(x, dim=1, dtype=torch.float64) for c in centres for x in (c.d, c.c)]
    ).square_()
    return norms.view(len(centres), 2, -1).prod(1).sum(0)
