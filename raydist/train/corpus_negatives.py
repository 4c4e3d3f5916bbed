"""Corpus-mined hard negatives (issue #47 item 3, the mining step): a split embedded by a model (a checkpoint's, or
the latest of a run), a FAISS index of its database rows, and for every query the K negatives ranked in
``[lo, hi]`` among the rows that may be its negatives, each scoring below the query's positive score × (1 −
margin) (docs/algorithms.md#corpus-mined-negatives).

A database row sharing the query's relevance key (its image, or its label) is never a negative and is not
ranked. In training (``loss.mined_negatives=K``) :class:`CorpusNegativesHook` mines the train split every
``loss.mine_every`` steps from the model as it is and hands the rows to the loss kind, whose losses score each
step's queries against the rows mined for the step's global batch as extra keys, detached
(:meth:`raydist.losses.LossKind.memory_rows`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from raydist.checkpoint import StateRegistry
from raydist.config import Config, ConfigError
from raydist.console import say
from raydist.losses.memory import MinedNegatives
from raydist.retrieval.sets import RetrievalSet
from raydist.tasks import StepContext, Task, to_tensors
from raydist.train.hooks import Hook


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
    import faiss  # only a run that mines pays its import (the loop's workers import this module)

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


class CorpusNegativesHook(Hook):
    """``loss.mined_negatives=K``: before step 0 and every ``loss.mine_every`` steps, the in-memory train split
    embedded by the model as it is (eval mode, no graph), mined (:func:`mine_negatives`: the first embedding's
    rows against the last one's, pairs' images against captions, labels' rows against each other; keys
    ``image_id`` or ``label``) and handed to the loss kind (``loss_fn.mined``), which scores the rows mined for each
    step's batch from then on. Every rank holds the whole split and mines it alike. The mined rows are
    checkpoint state, so a resumed run scores the same rows until the next mining."""

    def __init__(self, cfg: Config, task: Task, arrays: dict[str, np.ndarray] | None, device: Any, rank: int):
        if arrays is None or task.epoch_transform() is not None:
            raise ConfigError(
                f"loss.mined_negatives={cfg.loss.mined_negatives} needs a feature train split read into memory "
                "(data.in_memory_max_mb), not a streamed or encoded-image one"
            )
        self.cfg, self.task, self.arrays, self.device, self.rank = cfg, task, arrays, device, rank
        self.kind = task.loss_fn

    def setup(self, model: nn.Module, registry: StateRegistry) -> None:
        self.model = model
        registry.register("corpus_negatives", self)

    def before_step(self, ctx: StepContext) -> None:
        mined = self.kind.mined
        if ctx.global_step % self.cfg.loss.mine_every == 0 and (
            mined is None or mined.step != ctx.global_step
        ):
            self.kind.mined = self.mine(ctx.global_step)

    @torch.no_grad()
    def mine(self, step: int) -> MinedNegatives:
        """The train split embedded and mined at ``step`` (module docstring)."""
        lo = self.cfg.loss
        training, rows = self.model.training, self.arrays
        self.model.eval()
        count, size, parts = len(next(iter(rows.values()))), self.cfg.eval.batch_size, []
        for start in range(0, count, size):
            encoded = self.task.encode(
                self.model, to_tensors({k: v[start : start + size] for k, v in rows.items()}, self.device)
            )
            parts.append({**{k: v.float() for k, v in encoded.embeddings.items()}, **encoded.ids})
        self.model.train(training)
        embedded = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        names = list(encoded.embeddings)
        key = next(k for k in encoded.ids if k != "sample_id")
        unit = {n: nn.functional.normalize(embedded[n], dim=1).cpu().numpy() for n in names}
        keys = embedded[key].cpu().numpy()
        table = mine_negatives(
            unit[names[0]],
            unit[names[-1]],
            keys,
            keys,
            k=lo.mined_negatives,
            ranks=(lo.mine_range[0], lo.mine_range[1]),
            margin=lo.mine_margin,
            exclude_self=len(names) == 1,
        )
        if self.rank == 0:
            say(
                f"[raydist] step {step}: {lo.mined_negatives} hard negatives mined for each of {count} train rows "
                f"(ranks {lo.mine_range[0]}-{lo.mine_range[1]}, margin {lo.mine_margin}); the batches use them from "
                "this step"
            )
        return MinedNegatives(embedded, torch.from_numpy(table).to(embedded[key].device), step)

    def after_step(self, ctx: StepContext, loss: float, stats: dict[str, float]) -> None:
        stats["mined/step"] = float(self.kind.mined.step)

    def state_dict(self) -> dict[str, Any]:
        return self.kind.mined.state_dict() if self.kind.mined is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kind.mined = MinedNegatives.from_state(state) if state else None
