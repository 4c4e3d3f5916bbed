"""One retrieval direction of an embedded split: queries search a database, relevance by key; made by a task's
``embed``, searched and scored by the retrieval evaluation and indexed by ``raydist index``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class RetrievalSet:
    """One retrieval direction: ``queries`` search ``database``; database row j is relevant to query q iff
    ``database_keys[j] == query_keys[q]``.

    A ``two_way`` set (``pairs``: database = images, one row each in first-appearance order, queries =
    captions, keys = image row; t2i) is scored both ways (:meth:`directions` adds i2t, the roles swapped) by
    Recall@K, the VSE++ protocol. A one-way set (``labels``: database = queries = all rows, keys = clean
    labels, ``exclude_self``: query q is database row q and never retrieves itself) is scored by the label
    metrics: 1-NN, P@k, mAP@k.
    Embeddings are the model outputs (float32); every prefix is re-normalised where it is used, and since
    ``normalize(normalize(z)[:m]) = normalize(z[:m])`` a prefix of a unit output is the nested embedding.
    """

    task: str  # the task's name (recorded in reports and index metadata)
    direction: str  # "t2i" / "i2t" (pairs) or "knn" (labels)
    database: np.ndarray  # [N, D]
    queries: np.ndarray  # [Q, D]
    database_keys: np.ndarray  # [N]
    query_keys: np.ndarray  # [Q]
    database_ids: np.ndarray  # [N] dataset ids (image_id / sample_id)
    query_ids: np.ndarray  # [Q] dataset ids (sample_id)
    exclude_self: bool = False
    two_way: bool = False  # scored in both directions by Recall@K; else one way by label metrics
    source: str = ""  # the checkpoint folder
    split: str = ""

    @property
    def dim(self) -> int:
        return self.database.shape[1]

    @property
    def prefix(self) -> str:
        """Prefix of this direction's metric and cost keys: ``"t2i_"`` / ``"i2t_"`` when two-way, else none."""
        return f"{self.direction}_" if self.two_way else ""

    def directions(self) -> list[RetrievalSet]:
        """The directions every metric is computed on: two-way ``[self, self with the roles swapped]``."""
        if not self.two_way:
            return [self]
        swapped = "i2t" if self.direction == "t2i" else "t2i"
        return [
            self,
            replace(
                self,
                direction=swapped,
                database=self.queries,
                queries=self.database,
                database_keys=self.query_keys,
                query_keys=self.database_keys,
                database_ids=self.query_ids,
                query_ids=self.database_ids,
            ),
        ]


def concat_sets(sets: Sequence[RetrievalSet]) -> RetrievalSet:
    """Several splits' sets of one task and direction as one (rows in the given order, ``split`` joined by
    "+"). Two-way sets key queries by database row, so each set's keys are offset by the database rows before
    it; one-way sets key by label, kept as they are."""
    if not sets or len({(s.task, s.direction, s.two_way, s.exclude_self) for s in sets}) != 1:
        raise ValueError("concat_sets: expected one or more sets of the same task and direction")
    offsets = np.cumsum([0] + [len(s.database) for s in sets[:-1]]) if sets[0].two_way else [0] * len(sets)

    def joined(name: str, offset: bool = False) -> np.ndarray:
        return np.concatenate(
            [getattr(s, name) + (o if offset else 0) for s, o in zip(sets, offsets, strict=False)]
        )

    return replace(
        sets[0],
        database=joined("database"),
        queries=joined("queries"),
        database_keys=joined("database_keys", True),
        query_keys=joined("query_keys", True),
        database_ids=joined("database_ids"),
        query_ids=joined("query_ids"),
        split="+".join(s.split for s in sets),
    )
