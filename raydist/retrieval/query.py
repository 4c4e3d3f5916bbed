"""An index folder written by ``raydist index`` searched with new queries: the folder opened with the checkpoint
that embeds them, a ``--queries`` file read, the top k found by :func:`raydist.retrieval.search.search`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raydist.checkpoint import ChosenCheckpoint
from raydist.retrieval.embedder import Embedder
from raydist.retrieval.index import INDEX_META, FaissIndex, load_indexes
from raydist.retrieval.search import search


@dataclass(frozen=True)
class SearchResult:
    """Top-k of each query in an index: dataset ids [Q, k] (``indexes.json``'s ``database_ids``), inner
    products of unit vectors [Q, k] best first, the dim searched and the checkpoint that embedded the queries."""

    ids: np.ndarray
    scores: np.ndarray
    dim: int
    checkpoint: ChosenCheckpoint
    meta: dict[str, Any]


def read_queries(path: str | Path) -> list[str] | np.ndarray:
    """A ``--queries`` file: ``.npy`` → feature vectors [N, D]; any other file → one text per non-empty line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"queries file {path} does not exist")
    if path.suffix == ".npy":
        features = np.load(path, allow_pickle=False)
        if features.ndim != 2 or len(features) == 0:
            raise ValueError(
                f"{path}: expected a 2-D array of feature vectors [N >= 1, D], got shape {features.shape}"
            )
        return features
    texts = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not texts:
        raise ValueError(f"{path}: no queries (expected one text per line)")
    return texts


def open_index(
    index_dir: str | Path, checkpoint: str | Path | None = None
) -> tuple[dict[int, FaissIndex], dict[str, Any], Embedder]:
    """An index folder written by ``raydist index`` (:func:`raydist.retrieval.trained.write_checkpoint_indexes`):
    its indexes by dim, its ``indexes.json`` (with ``database_ids``) and the Embedder of the checkpoint it records (or
    ``checkpoint``), refused when that model's task is not the index's."""
    index_dir = Path(index_dir)
    if not (index_dir / INDEX_META).is_file():
        raise FileNotFoundError(
            f"{index_dir}: no {INDEX_META}; build an index with "
            f"`raydist index --checkpoint RUN --out {index_dir}`"
        )
    indexes, meta = load_indexes(index_dir)
    embedder = Embedder.from_checkpoint(checkpoint or meta["checkpoint"])
    if embedder.trained.task.name != meta["task"]:
        raise ValueError(
            f"checkpoint {embedder.trained.checkpoint_path} is a {embedder.trained.task.name!r} model; "
            f"the index at {index_dir} holds {meta['task']!r} embeddings"
        )
    return indexes, meta, embedder


def index_database(indexes: dict[int, FaissIndex]) -> np.ndarray:
    """The database rows the adaptive and funnel re-ranks read: the unit vectors the largest index holds (as
    its codes hold them: approximate for a product-quantised index)."""
    import faiss

    top = indexes[max(indexes)].index
    ivf = faiss.try_extract_index_ivf(top)
    if ivf is not None and ivf.direct_map.type == faiss.DirectMap.NoMap:
        ivf.make_direct_map()  # an IVF index (one chosen under a budget) reconstructs rows through it
    return top.reconstruct_n(0, top.ntotal)


def search_index(
    index_dir: str | Path,
    queries: Sequence[str] | np.ndarray,
    *,
    k: int = 10,
    dim: int | None = None,
    checkpoint: str | Path | None = None,
    mode: str = "flat",
    shortlist: int = 200,
) -> SearchResult:
    """Search an index folder written by ``raydist index`` (:func:`open_index`) with texts or feature vectors,
    embedded by the checkpoint the index records (or ``checkpoint``): top-``k`` dataset ids at ``dim``
    (default: the index's largest dim), best first, by ``mode`` (flat, adaptive or funnel;
    :func:`raydist.retrieval.search.search`)."""
    if k < 1:
        raise ValueError(f"--k {k}: expected k >= 1")
    indexes, meta, embedder = open_index(index_dir, checkpoint)
    dim = max(indexes) if dim is None else dim
    if dim not in indexes:
        raise ValueError(f"--dim {dim}: {Path(index_dir) / INDEX_META} has indexes at dims {sorted(indexes)}")
    texts = not isinstance(queries, np.ndarray)
    vectors = embedder.embed_texts(list(queries)) if texts else embedder.embed_features(queries)
    database = None if mode == "flat" else index_database(indexes)
    scores, rows = search(
        indexes,
        vectors,
        min(k, indexes[dim].ntotal),
        dim=dim,
        mode=mode,
        shortlist=shortlist,
        database=database,
    )
    return SearchResult(meta["database_ids"][rows], scores, dim, embedder.checkpoint, meta)
