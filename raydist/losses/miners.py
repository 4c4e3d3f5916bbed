"""Negative miners of the ranking loss: they run without autograd and return index tuples.

VSE++ MH is the hardest-negative miner followed by a hinge on the mined (query, positive, negative) rows;
SH is the all-negatives miner. Because the hinge is monotone, max of hinges = hinge of the max, so the
mined rows give MH's exact value and gradient while the miner walks the scores in key tiles: memory
O(Q · tile) for the scores, no [Q, K] tensor kept for backward.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from raydist.losses.similarity import pairwise_similarity


class HardestNegatives(NamedTuple):
    """Per query and direction: the hardest negative key (−1 when the query has none) and its score."""

    image_query_key: Tensor  # [Q] long: caption key with the highest s(query image, key caption)
    image_query_score: Tensor  # [Q]: that score (−inf when none)
    caption_query_key: Tensor  # [Q] long: image key with the highest s(key image, query caption)
    caption_query_score: Tensor  # [Q]
    masked_pairs: int  # (query, key) pairs, both directions, sharing an id although not the query's own row


class NegativePairs(NamedTuple):
    """Index tuples (query, key) of every negative, the same for both directions (SH's miner)."""

    queries: Tensor
    keys: Tensor


def _fold(best: Tensor, arg: Tensor, scores: Tensor, offset: int) -> None:
    """Running (max, argmax) along dim 1 of a score tile, keys numbered from ``offset``; first max wins."""
    tile_best, tile_arg = scores.max(1)
    better = tile_best > best
    best.copy_(torch.where(better, tile_best, best))
    arg.copy_(torch.where(better, tile_arg + offset, arg))


@torch.no_grad()
def mine_hardest_negatives(
    query_img: Tensor,
    query_cap: Tensor,
    key_img: Tensor,
    key_cap: Tensor,
    query_ids: Tensor,
    key_ids: Tensor,
    *,
    similarity: str = "dot",
    tile: int = 4096,
    query_positions: Tensor | None = None,
    key_positions: Tensor | None = None,
) -> HardestNegatives:
    """For each query q: ``argmax_{k: id_k ≠ id_q} s(I_q, C_k)`` and ``argmax_{k: id_k ≠ id_q} s(I_k, C_q)``.

    Keys are walked in tiles of ``tile`` with a running (max, argmax) per query. When the queries are the
    keys (one process, square batch) a tile of ``S = s(img, cap)`` serves both directions: its row maxima
    for image queries and its column maxima for caption queries. ``query_positions``/``key_positions``
    (default: row numbers) identify a query's own row for the ``masked_pairs`` count.
    """
    q, k = query_img.shape[0], key_img.shape[0]
    device = query_img.device
    square = query_img is key_img and query_cap is key_cap
    qpos = torch.arange(q, device=device) if query_positions is None else query_positions
    kpos = torch.arange(k, device=device) if key_positions is None else key_positions
    neg_inf = torch.tensor(-torch.inf, device=device, dtype=query_img.dtype)
    img_best = torch.full((q,), -torch.inf, device=device, dtype=query_img.dtype)
    cap_best = img_best.clone()
    img_arg = torch.full((q,), -1, device=device, dtype=torch.long)
    cap_arg = img_arg.clone()
    masked = 0
    for start in range(0, k, tile):
        stop = min(start + tile, k)
        same = query_ids.unsqueeze(1) == key_ids[start:stop].unsqueeze(0)  # [Q, t]
        masked += int((same & (qpos.unsqueeze(1) != kpos[start:stop].unsqueeze(0))).sum())
        img_scores = pairwise_similarity(query_img, key_cap[start:stop], similarity)
        _fold(img_best, img_arg, torch.where(same, neg_inf, img_scores), start)
        if square:  # columns start..stop of S are caption queries; their keys are all Q image rows
            col = torch.where(same, neg_inf, img_scores).T  # [t, Q]: caption query c vs image keys
            best, arg = col.max(1)
            cap_best[start:stop], cap_arg[start:stop] = best, torch.where(best > -torch.inf, arg, -1)
        else:
            cap_scores = pairwise_similarity(key_img[start:stop], query_cap, similarity).T
            _fold(cap_best, cap_arg, torch.where(same, neg_inf, cap_scores), start)
    return HardestNegatives(img_arg, img_best, cap_arg, cap_best, 2 * masked)


def mine_all_negatives(query_ids: Tensor, key_ids: Tensor) -> NegativePairs:
    """Every (query, key) with ``id_q ≠ id_k``: SH's negatives (in both directions)."""
    queries, keys = torch.nonzero(query_ids.unsqueeze(1) != key_ids.unsqueeze(0), as_tuple=True)
    return NegativePairs(queries, keys)
