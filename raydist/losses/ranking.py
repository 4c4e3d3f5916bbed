"""Bidirectional hinge ranking losses of VSE++ (Faghri et al. 2018): SH (sum of hinges) and MH (max of hinges).

MH is the hardest-negative miner (raydist.losses.miners.hardest_negatives) followed by hinge terms on the mined (query,
positive, negative) tuples; SH is the tiled sum of hinges (raydist.losses.tiled_sh); both are reduced by
raydist.losses.reducers. :func:`mined_ranking_terms` computes them for queries against keys (square in one
process, rectangular ``[local queries × global keys]`` across workers, both given as :class:`RankingInputs`)
with memory O((Q + K)·D + tile); :func:`ranking_loss` is its single-process use. :func:`ranking_terms` is the
dense reference (every [Q, K] score and cost materialised), public on purpose: the definition the tiled path
is checked against, readable on a small batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from raydist.losses.miners.hardest_negatives import HardestNegatives, mine_hardest_negatives
from raydist.losses.ranking_inputs import RankingInputs
from raydist.losses.reducers import Reducer, reduce_queries
from raydist.losses.similarity import Similarity, get_similarity, paired_similarity, pairwise_similarity
from raydist.losses.tiled_sh import sum_of_hinges


def hinge_costs(scores: Tensor, positives: Tensor, negatives: Tensor, margin: float) -> Tensor:
    """``c[q, k] = [α − s_q⁺ + s_qk]₊`` where ``negatives[q, k]``, else 0.  Shapes [Q, K], [Q], [Q, K]."""
    costs = (margin - positives.unsqueeze(1) + scores).clamp(min=0)
    return costs.masked_fill(~negatives, 0.0)


def reduce_negatives(costs: Tensor, hardest: bool) -> Tensor:
    """Per-query loss ``[Q]``: max over keys (MH) or sum over keys (SH).

    Costs are ``>= 0`` and masked keys cost 0, so a query with no negative key contributes 0 in MH.
    """
    if costs.shape[1] == 0:
        return costs.sum(1)
    return costs.amax(1) if hardest else costs.sum(1)


class RankingTerms(NamedTuple):
    """Per-query losses of both directions."""

    image_queries: Tensor  # [Q] image k ranks caption keys: Σ/max_l [α − S_kk + S_kl]₊
    caption_queries: Tensor  # [Q] caption k ranks image keys: Σ/max_l [α − S_kk + S_lk]₊


def ranking_terms(
    inputs: RankingInputs, *, margin: float, hardest: bool, similarity: str | Similarity = "dot"
) -> RankingTerms:
    """Hinge terms of Q query pairs against K key pairs, in both directions, from the dense [Q, K] scores.

    Query pair q = (query_img[q], query_cap[q]) has positive score ``s(I_q, C_q)``; key k is a negative
    of q iff ``query_ids[q] != key_ids[k]`` (so a query's own row and rows of the same image never are).
    """
    positives = inputs.positives(similarity)
    negatives = inputs.query_ids.unsqueeze(1) != inputs.key_ids.unsqueeze(0)
    image_scores = pairwise_similarity(inputs.query_img, inputs.key_cap, similarity)
    caption_scores = pairwise_similarity(inputs.key_img, inputs.query_cap, similarity).T
    return RankingTerms(
        image_queries=reduce_negatives(hinge_costs(image_scores, positives, negatives, margin), hardest),
        caption_queries=reduce_negatives(hinge_costs(caption_scores, positives, negatives, margin), hardest),
    )


def hinge_terms(positives: Tensor, negatives: Tensor, margin: float) -> Tensor:
    """Per-element hinge ``[α − s⁺ + s⁻]₊`` of mined tuples (same shapes)."""
    return (margin - positives + negatives).clamp(min=0)


def _hardest_direction(
    positives: Tensor,
    query_emb: Tensor,
    key_emb: Tensor,
    key: Tensor,
    margin: float,
    similarity: Similarity,
    image_is_query: bool,
) -> Tensor:
    """MH terms of one direction: the hinge on each query's mined key row (0 where none was mined).

    The rows are gathered with ``index_select``, whose backward (``index_add``) is ~4× faster on CPU than
    that of advanced indexing (an accumulating ``index_put``).
    """
    has = key >= 0
    rows = key_emb.index_select(0, key.clamp(min=0))
    pair = (query_emb, rows) if image_is_query else (rows, query_emb)
    terms = hinge_terms(positives, paired_similarity(*pair, similarity), margin)
    return torch.where(has, terms, torch.zeros_like(terms))


def mined_ranking_terms(
    inputs: RankingInputs,
    *,
    margin: float,
    hardest: bool,
    similarity: str | Similarity = "dot",
    tile: int = 4096,
) -> tuple[Tensor, Tensor, HardestNegatives]:
    """Per-query terms ``([Q] image queries, [Q] caption queries, hardest negatives)``.

    MH: the hardest-negative miner (no autograd, tiles of ``tile`` keys × ``TILE_ELEMENTS / tile`` queries)
    then the hinge on the mined rows only — memory O(Q·D) kept for backward. SH: :func:`sum_of_hinges` over
    the same tiles, recomputed in backward. The hardest negatives are returned in both cases (the step's
    statistics use them).
    """
    similarity = get_similarity(similarity)
    positives = inputs.positives(similarity)
    mined = mine_hardest_negatives(inputs, similarity=similarity, tile=tile)
    if hardest:
        image_terms = _hardest_direction(
            positives, inputs.query_img, inputs.key_cap, mined.image_query_key, margin, similarity, True
        )
        caption_terms = _hardest_direction(
            positives, inputs.query_cap, inputs.key_img, mined.caption_query_key, margin, similarity, False
        )
        return image_terms, caption_terms, mined
    image_terms, caption_terms = sum_of_hinges(
        positives, inputs, margin=margin, similarity=similarity, tile=tile
    )
    return image_terms, caption_terms, mined


def ranking_loss(
    img: Tensor,
    cap: Tensor,
    *,
    margin: float = 0.2,
    hardest: bool = True,
    image_ids: Tensor | None = None,
    reduction: str | Reducer = "sum",
    similarity: str | Similarity = "dot",
) -> Tensor:
    """VSE++ ranking loss of a batch of N pairs (``img[k]`` ↔ ``cap[k]``, both [N, D], L2-normalised).

    With ``S = s(img, cap)`` (rows images, columns captions), SH is
    ``Σ_k Σ_{l≠k} [α − S_kk + S_kl]₊ + Σ_l Σ_{k≠l} [α − S_ll + S_kl]₊`` and MH (``hardest=True``) replaces
    each inner Σ by max (docs/algorithms.md#ranking-loss). Rows sharing an ``image_id`` are never each
    other's negatives (without ids only the diagonal is masked). ``reduction="mean"`` divides the sum by
    the 2N query terms. Computed tiled by :func:`mined_ranking_terms` (MH: miner + hinge on the mined rows;
    SH: tiled sums).
    """
    n = img.shape[0]
    ids = torch.arange(n, device=img.device) if image_ids is None else image_ids.to(img.device)
    image_terms, caption_terms, _ = mined_ranking_terms(
        RankingInputs.batch(img, cap, ids), margin=margin, hardest=hardest, similarity=similarity
    )
    return reduce_queries(image_terms.sum() + caption_terms.sum(), reduction, 2 * n)


def mh_collapse_value(num_queries: int, margin: float, reduction: str | Reducer) -> float:
    """MH's loss on collapsed embeddings (every score equal): each query's hardest negative scores like its
    positive, so each of the ``2N`` query terms (N image and N caption queries; N = the global query batch)
    is ``[α − s + s]₊ = α``: ``2·N·α`` for ``reduction="sum"``, ``α`` for "mean" (:func:`reduce_queries`)."""
    total = torch.tensor(2 * num_queries * margin, dtype=torch.float64)
    return float(reduce_queries(total, reduction, 2 * num_queries))
