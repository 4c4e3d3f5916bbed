"""Corpus-mined hard negatives (issue #47 item 3, the mining step): a split embedded by a model (a checkpoint's, or
the latest of a run), a FAISS index of its database rows, and for every query the K negatives ranked in
``[lo, hi]`` among the rows that may be its negatives, each scoring below the query's positive score × (1 −
margin) (docs/algorithms.md#corpus-mined-negatives).

A database row sharing the query's relevance key (its image, or its label) is never a negative and is not
ranked. The batches of a training run do not read these negatives yet: this module is the mining, exact and
tested against a brute-force ranking.
"""

from __future__ import annotations

import faiss
import numpy as np

from raydist.retrieval.sets import RetrievalSet


def positive_scores(
    queries: np.ndarray,
    database: np.ndarray,
    query_keys: np.ndarray,
    database_keys: np.ndarray,
    exclude_self: bool = False,
) -> np.ndarray:
    """Each query's positive score: the highest inner product with a database row of its key (pairs: its own
    image, the only one; labels: its nearest row of its label, itself left out with ``exclude_self``); −inf for
    a query without one."""
    rows_of: dict[int, np.ndarray] = {}
    for key in np.unique(database_keys):
        rows_of[key] = np.flatnonzero(database_keys == key)
    out = np.full(len(queries), -np.inf, dtype=np.float32)
    for q, key in enumerate(query_keys):
        rows = rows_of.get(key, np.empty(0, dtype=np.int64))
        if exclude_self:
            rows = rows[rows != q]
        if len(rows):
            out[q] = (database[rows] @ queries[q]).max()
    return out


def mine_negatives(
    queries: np.ndarray,
    database: np.ndarray,
    query_keys: np.ndarray,
    database_keys: np.ndarray,
    *,
    k: int,
    ranks: tuple[int, int],
    margin: float,
    exclude_self: bool = False,
) -> np.ndarray:
    """``[Q, k]`` database rows (−1 where fewer qualify): for query q, the rows j with ``key_j ≠ key_q`` ranked
    ``lo … hi`` (1 = the highest-scoring such row; ties in FAISS's order) by the inner product, keeping those with
    ``score < positive_q · (1 − margin)`` (:func:`positive_scores`; ``exclude_self``: query q is database row q and
    is not its own positive), hardest first. The index is exact (``faiss.IndexFlatIP``) over the rows searched
    deep enough that the masked rows cannot push a candidate out: ``hi`` + the most rows any key has."""
    lo, hi = ranks
    if not 1 <= lo <= hi:
        raise ValueError(f"rank range [{lo}, {hi}]: need 1 <= lo <= hi")
    queries, database = np.ascontiguousarray(queries, np.float32), np.ascontiguousarray(database, np.float32)
    index = faiss.IndexFlatIP(database.shape[1])
    index.add(database)
    _, counts = np.unique(database_keys, return_counts=True)
    depth = min(database.shape[0], hi + int(counts.max()))
    scores, rows = index.search(queries, depth)
    positive = positive_scores(queries, database, query_keys, database_keys, exclude_self)
    out = np.full((len(queries), k), -1, dtype=np.int64)
    for q in range(len(queries)):
        candidates = (rows[q] >= 0) & (database_keys[rows[q]] != query_keys[q])
        ranked_rows, ranked_scores = rows[q][candidates][lo - 1 : hi], scores[q][candidates][lo - 1 : hi]
        kept = ranked_rows[ranked_scores < positive[q] * (1 - margin)][:k]
        out[q, : len(kept)] = kept
    return out


def mine_set_negatives(rset: RetrievalSet, *, k: int, ranks: tuple[int, int], margin: float) -> np.ndarray:
    """:func:`mine_negatives` for an embedded split's one direction (e.g. a checkpoint's
    ``load_trained(path).embed("train")``: pairs' captions against the images, labels' rows against each other
    by their labels)."""
    return mine_negatives(
        rset.queries,
        rset.database,
        rset.query_keys,
        rset.database_keys,
        k=k,
        ranks=ranks,
        margin=margin,
        exclude_self=rset.exclude_self,
    )
