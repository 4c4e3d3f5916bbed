"""Bidirectional hinge ranking losses of VSE++ (Faghri et al. 2018): SH (sum of hinges) and MH (max of hinges).

One core, :func:`ranking_terms`, scores queries against keys (square in one process, rectangular
``[local queries × global keys]`` across workers); :func:`ranking_loss` is its single-process use.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from raydist.losses.similarity import paired_similarity, pairwise_similarity

REDUCTIONS = ("sum", "mean")


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


def reduce_queries(total: Tensor, reduction: str, num_query_terms: int) -> Tensor:
    """``"sum"``: the total as is (VSE++); ``"mean"``: the total divided by the number of query terms.

    In :func:`ranking_loss` there are ``2N`` query terms (N image queries + N caption queries).
    """
    if reduction == "sum":
        return total
    if reduction == "mean":
        return total / num_query_terms
    raise ValueError(f"reduction={reduction!r}: expected one of {REDUCTIONS}")


class RankingTerms(NamedTuple):
    """Per-query losses of both directions and the score blocks they came from (for statistics)."""

    image_queries: Tensor  # [Q] image k ranks caption keys: Σ/max_l [α − S_kk + S_kl]₊
    caption_queries: Tensor  # [Q] caption k ranks image keys: Σ/max_l [α − S_kk + S_lk]₊
    image_query_scores: Tensor  # [Q, K] s(query image, key caption)
    caption_query_scores: Tensor  # [Q, K] s(key image, query caption)
    negatives: Tensor  # [Q, K] bool: key is a negative of the query (different id)


def ranking_terms(
    query_img: Tensor,
    query_cap: Tensor,
    key_img: Tensor,
    key_cap: Tensor,
    query_ids: Tensor,
    key_ids: Tensor,
    *,
    margin: float,
    hardest: bool,
    similarity: str = "dot",
) -> RankingTerms:
    """Hinge terms of Q query pairs against K key pairs, in both directions.

    Query pair q = (query_img[q], query_cap[q]) has positive score ``s(I_q, C_q)``; key k is a negative
    of q iff ``query_ids[q] != key_ids[k]`` (so a query's own row and rows of the same image never are).
    """
    positives = paired_similarity(query_img, query_cap, similarity)
    negatives = query_ids.unsqueeze(1) != key_ids.unsqueeze(0)
    image_scores = pairwise_similarity(query_img, key_cap, similarity)
    caption_scores = pairwise_similarity(key_img, query_cap, similarity).T
    return RankingTerms(
        image_queries=reduce_negatives(hinge_costs(image_scores, positives, negatives, margin), hardest),
        caption_queries=reduce_negatives(hinge_costs(caption_scores, positives, negatives, margin), hardest),
        image_query_scores=image_scores,
        caption_query_scores=caption_scores,
        negatives=negatives,
    )


def ranking_loss(
    img: Tensor,
    cap: Tensor,
    *,
    margin: float = 0.2,
    hardest: bool = True,
    image_ids: Tensor | None = None,
    reduction: str = "sum",
    similarity: str = "dot",
) -> Tensor:
    """VSE++ ranking loss of a batch of N pairs (``img[k]`` ↔ ``cap[k]``, both [N, D], L2-normalised).

    With ``S = s(img, cap)`` (rows images, columns captions), SH is
    ``Σ_k Σ_{l≠k} [α − S_kk + S_kl]₊ + Σ_l Σ_{k≠l} [α − S_ll + S_kl]₊`` and MH (``hardest=True``) replaces
    each inner Σ by max (DESIGN.md §4). Rows sharing an ``image_id`` are never each other's negatives
    (without ids only the diagonal is masked). ``reduction="mean"`` divides the sum by the 2N query terms.
    """
    n = img.shape[0]
    ids = torch.arange(n, device=img.device) if image_ids is None else image_ids.to(img.device)
    terms = ranking_terms(img, cap, img, cap, ids, ids, margin=margin, hardest=hardest, similarity=similarity)
    total = terms.image_queries.sum() + terms.caption_queries.sum()
    return reduce_queries(total, reduction, 2 * n)
