"""The inputs of a ranking loss: Q query pairs ranked against K key pairs (one batch against itself, or a
rank's queries against the global keys)."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from raydist.losses.similarity import Similarity, paired_similarity


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

    def positives(self, similarity: str | Similarity) -> Tensor:
        """``s(I_q, C_q)`` of each query's own pair ``[Q]``."""
        return paired_similarity(self.query_img, self.query_cap, similarity)
