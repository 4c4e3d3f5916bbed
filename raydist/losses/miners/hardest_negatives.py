"""The hardest-negative miner of the ranking loss (VSE++ MH), without autograd: per query and direction the
key of the highest score among its negatives, from the score-tile walk (:mod:`raydist.losses.tiles`).

VSE++ MH is this miner followed by a hinge on the mined (query, positive, negative) rows: the hinge is monotone,
so max of hinges = hinge of the max and the mined rows give MH's exact value and gradient.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from raydist.losses.ranking_inputs import RankingInputs
from raydist.losses.similarity import Similarity, get_similarity
from raydist.losses.tiles import score_tiles, tile_scores, tile_shape

ARGMAX_GROUP = 64  # members per class of the two-level arg-max (:func:`_fold_max`)


class HardestNegatives(NamedTuple):
    """Per query and direction: the hardest negative key (−1 when the query has none) and its score."""

    image_query_key: Tensor  # [Q] long: caption key with the highest s(query image, key caption)
    image_query_score: Tensor  # [Q]: that score (−inf when none)
    caption_query_key: Tensor  # [Q] long: image key with the highest s(key image, query caption)
    caption_query_score: Tensor  # [Q]
    masked_pairs: int  # (query, key) pairs, both directions, sharing an id although not the query's own row


def _fold_max(scores: Tensor, dim: int, best: Tensor, arg: Tensor, offset: int) -> None:
    """Fold ``max``/``argmax`` of ``scores`` along ``dim`` into the running ``best``/``arg`` (in place, the
    index plus ``offset``). The first maximum wins: tiles are folded in index order and replace only when
    strictly larger.

    Two levels, both vectorised (an index-tracking reduction over the whole tile is ~7× slower than
    ``amax``): the n entries along ``dim`` form n/g classes of g consecutive entries; the class maxima
    (``amax``) and the first arg-max class are taken over the tile, then the first member of that class
    equal to the maximum: ``g − max_m(1[member m = max]·(g − m))``, again an ``amax``.
    """
    n = scores.shape[dim]
    group = math.gcd(n, ARGMAX_GROUP)
    classes = scores.view((n // group, group, -1) if dim == 0 else (-1, n // group, group))
    tile_best, tile_class = classes.amax(dim + 1).max(dim)
    shape = list(classes.shape)
    shape[dim] = 1
    members = classes.gather(dim, tile_class.unsqueeze(dim).unsqueeze(dim).expand(shape)).squeeze(dim)
    countdown = torch.arange(group, 0, -1, device=scores.device, dtype=torch.int8).unsqueeze(1 - dim)
    first = group - ((members == tile_best.unsqueeze(dim)) * countdown).amax(dim)
    better = tile_best > best
    best.copy_(torch.where(better, tile_best, best))
    arg.copy_(torch.where(better, tile_class * group + first + offset, arg))


@torch.no_grad()
def mine_hardest_negatives(
    inputs: RankingInputs, *, similarity: str | Similarity = "dot", tile: int = 4096
) -> HardestNegatives:
    """For each query q: ``argmax_{k: id_k ≠ id_q} s(I_q, C_k)`` and ``argmax_{k: id_k ≠ id_q} s(I_k, C_q)``.

    Scores are walked in tiles of ``tile`` keys × :func:`tile_shape` queries with a running (max, argmax)
    per query. When the queries are the keys (one process, square batch) a tile of ``S = s(img, cap)``
    serves both directions: row maxima for image queries, column maxima for caption queries; otherwise
    ``s(I_q, C_k)`` and ``s(I_k, C_q)`` are walked in turn. The positions of ``inputs`` identify a query's
    own row for the ``masked_pairs`` count.
    """
    query_img, query_cap, key_img, key_cap, query_ids, key_ids, qpos, kpos = inputs
    similarity = get_similarity(similarity)
    q = query_img.shape[0]
    device = query_img.device
    square = inputs.square
    qpos = torch.arange(q, device=device) if qpos is None else qpos
    kpos = torch.arange(key_img.shape[0], device=device) if kpos is None else kpos
    img_best = torch.full((q,), -torch.inf, device=device, dtype=query_img.dtype)
    cap_best = img_best.clone()
    img_arg = torch.full((q,), -1, device=device, dtype=torch.long)
    cap_arg = img_arg.clone()
    queries, keys = tile_shape(tile, query_img.shape[1], similarity)
    masked = 0
    for t in score_tiles(query_ids, key_ids, queries, keys):  # rows: image queries, columns: caption keys
        masked += int((qpos[t.rows][t.same_rows] != kpos[t.cols][t.same_cols]).sum())
        scores = tile_scores(query_img, key_cap, t, similarity)
        _fold_max(scores, 1, img_best[t.rows], img_arg[t.rows], t.cols.start)
        if square:  # the columns of this tile are caption queries, its rows their image keys
            _fold_max(scores, 0, cap_best[t.cols], cap_arg[t.cols], t.rows.start)
    if not square:
        for t in score_tiles(key_ids, query_ids, keys, queries):  # rows: image keys, columns: caption queries
            scores = tile_scores(key_img, query_cap, t, similarity)
            _fold_max(scores, 0, cap_best[t.cols], cap_arg[t.cols], t.rows.start)
    return HardestNegatives(img_arg, img_best, cap_arg, cap_best, 2 * masked)
