"""Corpus-mined hard negatives (``loss.mined_negatives``): a split embedded by a model (a checkpoint's, or
the latest of a run), a FAISS index of its database rows, and for every query the K negatives ranked in
``[lo, hi]`` among the rows that may be its negatives, each scoring below the query's positive score × (1 −
margin) (docs/algorithms.md#corpus-mined-negatives).

A database row sharing the query's relevance key (its image, or its label) is never a negative and is not
ranked. In training (``loss.mined_negatives=K``) :class:`CorpusNegativesHook` mines the train split every
``loss.mine_every`` steps from the model's weights -- inline in one process, or in a Ray actor beside Ray Train's
workers (:class:`CorpusMiner`), whose rows every rank takes at the same step boundary -- and hands the rows to
the loss kind, whose losses score each step's queries against the rows mined for the step's global batch as extra
keys, detached (:meth:`raydist.losses.LossKind.extra_keys`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from raydist.checkpoint import StateRegistry
from raydist.config import Config, ConfigError
from raydist.console import say
from raydist.distributed.reduce import all_reduce_sum
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


@torch.no_grad()
def mine_split(
    cfg: Config, task: Task, model: nn.Module, arrays: dict[str, np.ndarray], device: Any, step: int
) -> MinedNegatives:
    """The in-memory train split ``arrays`` embedded by ``model`` (eval mode, no graph) and mined
    (:func:`mine_negatives`: the first embedding's rows against the last one's -- pairs' images against captions,
    labels' rows against each other -- keyed by ``image_id`` or ``label``), as mined at ``step``."""
    lo = cfg.loss
    training = model.training
    model.eval()
    count, size, parts = len(next(iter(arrays.values()))), cfg.eval.batch_size, []
    for start in range(0, count, size):
        encoded = task.encode(
            model, to_tensors({k: v[start : start + size] for k, v in arrays.items()}, device)
        )
        parts.append({**{k: v.float() for k, v in encoded.embeddings.items()}, **encoded.ids})
    model.train(training)
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
    return MinedNegatives(embedded, torch.from_numpy(table).to(embedded[key].device), step)


class CorpusMiner:
    """The mining beside Ray Train's workers (a Ray actor, :meth:`CorpusNegativesHook.start_actor`): its own copy of
    the task, model and train split; :meth:`mine` takes the training model's weights of a step."""

    def __init__(self, cfg: Config, task: Task, arrays: dict[str, np.ndarray]) -> None:
        torch.set_num_threads(1)
        self.cfg, self.task, self.arrays = cfg, task, arrays
        self.model = task.build_model()
        self.results: dict[int, MinedNegatives] = {}

    def mine(self, state: dict[str, torch.Tensor], step: int) -> int:
        self.model.load_state_dict(state)
        self.results = {step: mine_split(self.cfg, self.task, self.model, self.arrays, "cpu", step)}
        return step

    def result(self, step: int) -> MinedNegatives:
        return self.results[step]


class CorpusNegativesHook(Hook):
    """``loss.mined_negatives=K``: the in-memory train split mined (:func:`mine_split`) from the model's weights of
    every ``loss.mine_every``-th step and handed to the loss kind (``loss_fn.mined``), which scores the rows mined
    for each step's batch from then on. In one process the mining runs inline before the step; with ``beside``
    (Ray Train workers) a :class:`CorpusMiner` actor mines while the workers train on, and every rank takes its
    rows at the same step boundary (:meth:`swap_when_ready`). The mined rows are checkpoint state, so a resumed
    run scores the same rows until the next mining."""

    def __init__(
        self,
        cfg: Config,
        task: Task,
        arrays: dict[str, np.ndarray] | None,
        device: Any,
        rank: int,
        *,
        beside: bool = False,
    ):
        if arrays is None or task.epoch_transform() is not None:
            raise ConfigError(
                f"loss.mined_negatives={cfg.loss.mined_negatives} needs a feature train split read into memory "
                "(data.in_memory_max_mb), not a streamed or encoded-image one"
            )
        self.cfg, self.task, self.arrays, self.device, self.rank = cfg, task, arrays, device, rank
        self.kind, self.beside, self.pending = task.loss_fn, beside, None

    def setup(self, model: nn.Module, registry: StateRegistry) -> None:
        self.model = model
        registry.register("corpus_negatives", self)
        if self.beside:
            self.start_actor()

    def start_actor(self) -> None:
        """Ray Train workers (``beside``): rank 0 starts a :class:`CorpusMiner` actor (0 CPUs: it shares the
        workers' CPUs) under a name every rank learns through one all-reduce, and the others look it up."""
        import ray

        token = float(np.random.SeedSequence().entropy % 2**52) if self.rank == 0 else 0.0
        name = (
            f"raydist-corpus-miner-{int(all_reduce_sum(torch.tensor([token], dtype=torch.float64)).item())}"
        )
        if self.rank == 0:
            miner = ray.remote(num_cpus=0)(CorpusMiner).options(name=name)
            self.actor = miner.remote(self.cfg, self.task, self.arrays)
            ray.get(self.actor.__ray_ready__.remote())
        all_reduce_sum(torch.zeros(1))  # the actor exists before the other ranks look it up
        if self.rank != 0:
            self.actor = ray.get_actor(name)

    def before_step(self, ctx: StepContext) -> None:
        step = ctx.global_step
        if self.beside:
            self.swap_when_ready(step)
            return
        mined = self.kind.mined
        if step % self.cfg.loss.mine_every == 0 and (mined is None or mined.step != step):
            self.kind.mined = self.mine(step)

    def swap_when_ready(self, step: int) -> None:
        """Beside training: at every ``loss.mine_every``-th step rank 0 hands the model's weights to the actor
        (unless a mining is still running); at every step boundary one all-reduce tells every rank whether a
        mining finished, and then all of them take its rows at this same step."""
        import ray

        if self.rank == 0 and self.pending is None and step % self.cfg.loss.mine_every == 0:
            state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
            self.pending = self.actor.mine.remote(state, step)
            self.announce(f"step {step}: mining {self.describe()} beside training")
        done = 0.0
        if self.rank == 0 and self.pending is not None and ray.wait([self.pending], timeout=0)[0]:
            done, self.pending = float(ray.get(self.pending)) + 1, None
        flag = int(all_reduce_sum(torch.tensor([done], dtype=torch.float64)).item())
        if flag:
            self.kind.mined = ray.get(self.actor.result.remote(flag - 1))
            self.announce(f"step {step}: the batches switch to the negatives mined at step {flag - 1}")

    def mine(self, step: int) -> MinedNegatives:
        """The train split embedded and mined at ``step``, in this process (:func:`mine_split`)."""
        mined = mine_split(self.cfg, self.task, self.model, self.arrays, self.device, step)
        self.announce(f"step {step}: {self.describe()} mined; the batches use them from this step")
        return mined

    def describe(self) -> str:
        """What a mining gives (for the console lines)."""
        lo = self.cfg.loss
        return (
            f"{lo.mined_negatives} hard negatives for each of {len(next(iter(self.arrays.values())))} train rows "
            f"(ranks {lo.mine_range[0]}-{lo.mine_range[1]}, margin {lo.mine_margin})"
        )

    def announce(self, text: str) -> None:
        """One console line on rank 0."""
        if self.rank == 0:
            say(f"[raydist] {text}")

    def after_step(self, ctx: StepContext, loss: float, stats: dict[str, float]) -> None:
        stats["mined/from_step"] = float(self.kind.mined.step) if self.kind.mined is not None else -1.0

    def state_dict(self) -> dict[str, Any]:
        return self.kind.mined.state_dict() if self.kind.mined is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kind.mined = MinedNegatives.from_state(state) if state else None
