"""Negative mining of the ranking loss: the score-tile walk (shared with the tiled SH loss) and the
hardest-negative miner, both without autograd.

VSE++ MH is the hardest-negative miner followed by a hinge on the mined (query, positive, negative) rows:
the hinge is monotone, so max of hinges = hinge of the max and the mined rows give MH's exact value and
gradient. Scores are walked in tiles of at most :data:`TILE_ELEMENTS`: memory O(tile), no [Q, K] tensor.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from raydist.losses.similarity import paired_similarity, pairwise_similarity

TILE_ELEMENTS = (
    1 << 22
)  # scores per tile (16 MiB in float32); order similarity counts its [.., D] intermediate
ARGMAX_GROUP = 64  # members per class of the two-level arg-max (:func:`_fold_max`)


class RankingInputs(NamedTuple):
    """Q query pairs ranked against K key pairs: embeddings ``[Q, D]``/``[K, D]`` and ids ``[Q]``/``[K]``.

    Key k is a negative of query q iff ``key_ids[k] != query_ids[q]``; the positive of query q is its own pair
    ``(query_img[q], query_cap[q])``. The positions (default: row numbers; unique) identify a query's own row
    among the keys for :attr:`HardestNegatives.masked_pairs`.
    """

    query_img: Tensor
    query_cap: Tensor
    key_img: Tensor
    key_cap: Tensor
    query_ids: Tensor
    key_ids: Tensor
    query_positions: Tensor | None = None
    key_positions: Tensor | None = None

    @classmethod
    def batch(cls, img: Tensor, cap: Tensor, ids: Tensor) -> RankingInputs:
        """One batch of pairs ranked against itself: the queries are the keys."""
        return cls(img, cap, img, cap, ids, ids)

    @property
    def square(self) -> bool:
        """The queries are the keys (the same tensors), so one score matrix serves both directions."""
        return self.query_img is self.key_img and self.query_cap is self.key_cap

    def positives(self, similarity: str) -> Tensor:
        """``s(I_q, C_q)`` of each query's own pair ``[Q]``."""
        return paired_similarity(self.query_img, self.query_cap, similarity)


class HardestNegatives(NamedTuple):
    """Per query and direction: the hardest negative key (−1 when the query has none) and its score."""

    image_query_key: Tensor  # [Q] long: caption key with the highest s(query image, key caption)
    image_query_score: Tensor  # [Q]: that score (−inf when none)
    caption_query_key: Tensor  # [Q] long: image key with the highest s(key image, query caption)
    caption_query_score: Tensor  # [Q]
    masked_pairs: int  # (query, key) pairs, both directions, sharing an id although not the query's own row


class ScoreTile(NamedTuple):
    """A block ``rows × cols`` of a score matrix and its same-id entries (block-local indices): the
    entries that are never negatives."""

    rows: slice
    cols: slice
    same_rows: Tensor
    same_cols: Tensor


def tile_shape(tile: int, dim: int, similarity: str) -> tuple[int, int]:
    """``(queries, keys)`` per tile: ``tile`` keys and ``max(1, TILE_ELEMENTS // (tile·w))`` queries, with
    ``w = D`` for order similarity (its [rows, cols, D] intermediate) and 1 otherwise."""
    width = dim if similarity == "order" else 1
    return max(1, TILE_ELEMENTS // (tile * width)), tile


def score_tiles(row_ids: Tensor, col_ids: Tensor, row_block: int, col_block: int) -> Iterator[ScoreTile]:
    """The ``row_block × col_block`` blocks of a [len(row_ids), len(col_ids)] score matrix, row-major.

    Same-id entries ``{(r, c): row_ids[r] = col_ids[c]}`` come from one sort per column block and a binary
    search of each row block's ids: O(block + same-id pairs) per block, no dense [rows, cols] comparison.
    """
    sorted_blocks = [
        (start, *col_ids[start : start + col_block].sort()) for start in range(0, col_ids.shape[0], col_block)
    ]
    for r0 in range(0, row_ids.shape[0], row_block):
        ids = row_ids[r0 : r0 + row_block]
        for c0, values, order in sorted_blocks:
            lo = torch.searchsorted(values, ids)
            count = torch.searchsorted(values, ids, right=True) - lo
            same_rows = torch.repeat_interleave(count)
            first = torch.cumsum(count, 0) - count
            rank = torch.arange(same_rows.shape[0], device=ids.device) - first[same_rows]
            same_cols = order[lo[same_rows] + rank]
            yield ScoreTile(
                slice(r0, r0 + ids.shape[0]), slice(c0, c0 + values.shape[0]), same_rows, same_cols
            )


def tile_scores(row_emb: Tensor, col_emb: Tensor, tile: ScoreTile, similarity: str) -> Tensor:
    """``s(row_emb[rows], col_emb[cols])`` with −inf at the tile's same-id entries."""
    scores = pairwise_similarity(row_emb[tile.rows], col_emb[tile.cols], similarity)
    scores[tile.same_rows, tile.same_cols] = -torch.inf
    return scores


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
    inputs: RankingInputs, *, similarity: str = "dot", tile: int = 4096
) -> HardestNegatives:
    """For each query q: ``argmax_{k: id_k ≠ id_q} s(I_q, C_k)`` and ``argmax_{k: id_k ≠ id_q} s(I_k, C_q)``.

    Scores are walked in tiles of ``tile`` keys × :func:`tile_shape` queries with a running (max, argmax)
    per query. When the queries are the keys (one process, square batch) a tile of ``S = s(img, cap)``
    serves both directions: row maxima for image queries, column maxima for caption queries; otherwise
    ``s(I_q, C_k)`` and ``s(I_k, C_q)`` are walked in turn. The positions of ``inputs`` identify a query's
    own row for the ``masked_pairs`` count.
    """
    query_img, query_cap, key_img, key_cap, query_ids, key_ids, qpos, kpos = inputs
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
