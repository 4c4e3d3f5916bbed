"""VSE++ SH (sum of hinges) as a tiled autograd function: per-query hinge sums computed tile by tile in the
forward and each tile recomputed in the backward, so no [Q, K] score or cost tensor is kept.

Memory O((Q + K)·D + tile) for forward and backward; the tiles are those of the miner
(:func:`raydist.losses.tiles.score_tiles`, :func:`~raydist.losses.tiles.tile_shape`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from raydist.losses.ranking_inputs import RankingInputs
from raydist.losses.similarity import Similarity, get_similarity, pairwise_similarity
from raydist.losses.tiles import score_tiles, tile_scores, tile_shape


class _Pass(NamedTuple):
    """One score matrix ``s(row_emb, col_emb)``; its rows are image queries and/or its columns are caption
    queries. ``row_input``/``col_input`` number the embeddings among the function's inputs."""

    row_input: int
    col_input: int
    row_ids: Tensor
    col_ids: Tensor
    row_block: int
    col_block: int
    image_rows: bool
    caption_cols: bool


def _passes(square: bool, query_ids: Tensor, key_ids: Tensor, queries: int, keys: int) -> list[_Pass]:
    """Square: one matrix ``s(img, cap)`` serves both directions. Otherwise ``s(I_q, C_k)`` (rows: image
    queries) then ``s(I_k, C_q)`` (columns: caption queries). Inputs: 0 query_img, 1 query_cap, 2 key_img,
    3 key_cap."""
    if square:
        return [_Pass(0, 1, query_ids, query_ids, queries, keys, True, True)]
    return [
        _Pass(0, 3, query_ids, key_ids, queries, keys, True, False),
        _Pass(2, 1, key_ids, query_ids, keys, queries, False, True),
    ]


class TiledSumOfHinges(torch.autograd.Function):
    """``(h_img, h_cap)`` with ``h_img[q] = Σ_{k: id_k ≠ id_q} [α − p_q + s(I_q, C_k)]₊`` and
    ``h_cap[q] = Σ_{k: id_k ≠ id_q} [α − p_q + s(I_k, C_q)]₊`` (positives ``p`` are an input)."""

    @staticmethod
    def forward(
        ctx: Any,
        positives: Tensor,
        query_img: Tensor,
        query_cap: Tensor,
        key_img: Tensor,
        key_cap: Tensor,
        query_ids: Tensor,
        key_ids: Tensor,
        margin: float,
        similarity: Similarity,
        tile: int,
        square: bool,
    ) -> tuple[Tensor, Tensor]:
        queries, keys = tile_shape(tile, query_img.shape[1], similarity)
        passes = _passes(square, query_ids, key_ids, queries, keys)
        embeddings = (query_img, query_cap, key_img, key_cap)
        thresholds = positives - margin  # cost = s − (p − α)
        image_terms = torch.zeros_like(positives)
        caption_terms = torch.zeros_like(positives)
        for p in passes:
            for t in score_tiles(p.row_ids, p.col_ids, p.row_block, p.col_block):
                scores = tile_scores(embeddings[p.row_input], embeddings[p.col_input], t, similarity)
                if p.image_rows:
                    image_terms[t.rows] += (scores - thresholds[t.rows, None]).clamp_(min=0).sum(1)
                if p.caption_cols:
                    caption_terms[t.cols] += (scores - thresholds[None, t.cols]).clamp_(min=0).sum(0)
        ctx.save_for_backward(positives, query_img, query_cap, key_img, key_cap, query_ids, key_ids)
        ctx.settings = (margin, similarity, tile, square)
        return image_terms, caption_terms

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, image_grad: Tensor, caption_grad: Tensor) -> tuple[Tensor | None, ...]:
        """Per tile: ``W = g_img[q]·1[cost ≥ 0]`` (rows) ``+ g_cap[q]·1[cost ≥ 0]`` (columns), zero at same
        ids; the similarity's vector-Jacobian product with W gives the embedding gradients and
        ``∂/∂p_q = −g_q · #{k: cost_qk ≥ 0}`` (the clamp's convention at 0)."""
        positives, query_img, query_cap, key_img, key_cap, query_ids, key_ids = ctx.saved_tensors
        margin, similarity, tile, square = ctx.settings
        queries, keys = tile_shape(tile, query_img.shape[1], similarity)
        embeddings = (query_img, query_cap, key_img, key_cap)
        grads = [torch.zeros_like(e) for e in embeddings]
        positives_grad = torch.zeros_like(positives)
        thresholds = positives - margin
        for p in _passes(square, query_ids, key_ids, queries, keys):
            for t in score_tiles(p.row_ids, p.col_ids, p.row_block, p.col_block):
                with torch.enable_grad():
                    rows = embeddings[p.row_input][t.rows].detach().requires_grad_()
                    cols = embeddings[p.col_input][t.cols].detach().requires_grad_()
                    scores = pairwise_similarity(rows, cols, similarity)
                weights = torch.zeros_like(scores)
                if p.image_rows:
                    active = scores.detach() >= thresholds[t.rows, None]
                    active[t.same_rows, t.same_cols] = False
                    positives_grad[t.rows] -= image_grad[t.rows] * active.sum(1)
                    weights += active * image_grad[t.rows, None]
                if p.caption_cols:
                    active = scores.detach() >= thresholds[None, t.cols]
                    active[t.same_rows, t.same_cols] = False
                    positives_grad[t.cols] -= caption_grad[t.cols] * active.sum(0)
                    weights += active * caption_grad[None, t.cols]
                row_grad, col_grad = torch.autograd.grad(scores, (rows, cols), weights)
                grads[p.row_input][t.rows] += row_grad
                grads[p.col_input][t.cols] += col_grad
        if square:
            grads[2] = grads[3] = None
        return positives_grad, *grads, None, None, None, None, None, None


def sum_of_hinges(
    positives: Tensor,
    inputs: RankingInputs,
    *,
    margin: float,
    similarity: str | Similarity = "dot",
    tile: int = 4096,
) -> tuple[Tensor, Tensor]:
    """SH per query, both directions ``([Q] image queries, [Q] caption queries)``, tiled
    (:class:`TiledSumOfHinges`): ``Σ_{k: id_k ≠ id_q} [α − p_q + s_qk]₊`` with positives ``p`` [Q].

    ``tile`` is keys per tile (queries per tile: :func:`raydist.losses.tiles.tile_shape`); one pass serves
    both directions when the queries are the keys (:attr:`RankingInputs.square`).
    """
    return TiledSumOfHinges.apply(
        positives,
        inputs.query_img,
        inputs.query_cap,
        inputs.key_img,
        inputs.key_cap,
        inputs.query_ids,
        inputs.key_ids,
        margin,
        get_similarity(similarity),
        tile,
        inputs.square,
    )
