"""A score matrix walked in tiles: the blocks of a [rows, cols] matrix with their same-id entries (never
negatives), so the hardest-negative miner and the tiled SH loss never hold the whole matrix.

Tiles hold at most :data:`TILE_ELEMENTS` scores: memory O(tile), no [Q, K] tensor.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from raydist.losses.similarity import Similarity, get_similarity, pairwise_similarity

TILE_ELEMENTS = (
    1 << 22
)  # scores per tile (16 MiB in float32); order similarity counts its [.., D] intermediate


class ScoreTile(NamedTuple):
    """A block ``rows × cols`` of a score matrix and its same-id entries (block-local indices): the
    entries that are never negatives."""

    rows: slice
    cols: slice
    same_rows: Tensor
    same_cols: Tensor


def tile_shape(tile: int, dim: int, similarity: str | Similarity) -> tuple[int, int]:
    """``(queries, keys)`` per tile: ``tile`` keys and ``max(1, TILE_ELEMENTS // (tile·w))`` queries, with
    ``w`` = :meth:`Similarity.width_per_score` (D for order similarity's [rows, cols, D] intermediate, else 1)."""
    width = get_similarity(similarity).width_per_score(dim)
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


def tile_scores(row_emb: Tensor, col_emb: Tensor, tile: ScoreTile, similarity: str | Similarity) -> Tensor:
    """``s(row_emb[rows], col_emb[cols])`` with −inf at the tile's same-id entries."""
    scores = pairwise_similarity(row_emb[tile.rows], col_emb[tile.cols], similarity)
    scores[tile.same_rows, tile.same_cols] = -torch.inf
    return scores
