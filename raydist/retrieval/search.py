"""The one search of nested (Matryoshka) embeddings: FAISS indexes at prefix dims over one database, searched
flat, adaptive or funnel (docs/algorithms.md#adaptive-and-funnel-retrieval); ``raydist search``,
``raydist serve`` and the retrieval evaluation all search through :func:`search`. numpy and faiss only."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from raydist.retrieval.index import FaissIndex, PrefixIVFIndex, unit_rows

MODES = ("flat", "adaptive", "funnel")
RERANK_CHUNK_FLOATS = 1 << 22  # gathered candidate rows per re-rank chunk (16 MiB of float32)


@dataclass(frozen=True)
class Cascade:
    """A funnel: search all of the database at ``dims[0]`` keeping ``shortlists[0]``, re-rank that list at
    ``dims[i]`` keeping ``shortlists[i]``, the last stage keeping k (``len(shortlists) == len(dims) − 1``).
    Adaptive retrieval is ``Cascade((D_s, D_r), (shortlist,))``; the MRL funnel is
    ``Cascade((16, 32, 64, 128, 2048), (200, 100, 50, 25))`` with k = 10."""

    dims: tuple[int, ...]
    shortlists: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.dims) < 2 or len(self.shortlists) != len(self.dims) - 1:
            raise ValueError(
                f"need len(shortlists) == len(dims) - 1 >= 1, got {self.dims}, {self.shortlists}"
            )
        if any(a < b for a, b in itertools.pairwise(self.shortlists)):
            raise ValueError(f"shortlists={self.shortlists}: expected non-increasing sizes")


def default_funnel(dims: Sequence[int], full: int, shortlist: int = 200, k: int = 10) -> Cascade:
    """The smallest (up to) four dims below ``full``, then ``full``; shortlists halve from ``shortlist``
    (never below k + 1): with dims 8…128 and D = 256, ``8→16→32→64→256`` keeping 200, 100, 50, 25."""
    stages = [d for d in sorted(dims) if d < full][:4]
    if not stages:
        raise ValueError(f"dims={list(dims)}: a funnel needs a dim below the embedding dim {full}")
    return Cascade((*stages, full), tuple(max(shortlist >> i, k + 1) for i in range(len(stages))))


def mode_cascade(mode: str, dims: Sequence[int], dim: int, k: int, shortlist: int = 200) -> Cascade | None:
    """The cascade a search ``mode`` runs at ``dim`` over indexes at ``dims``: ``flat`` none; ``adaptive``
    shortlists ``max(shortlist, k)`` rows at the smallest indexed dim below ``dim`` and re-ranks them at ``dim``;
    ``funnel`` re-ranks through up to four indexed dims below ``dim`` (:func:`default_funnel`)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: expected one of {', '.join(MODES)}")
    if mode == "flat":
        return None
    below = sorted(d for d in dims if d < dim)
    if not below:
        raise ValueError(f"{mode} search needs an index dim below dim={dim}; the index has {sorted(dims)}")
    shortlist = max(shortlist, k)
    if mode == "adaptive":
        return Cascade((below[0], dim), (shortlist,))
    return default_funnel(below, dim, shortlist, k)


def rerank(
    db: np.ndarray, queries: np.ndarray, candidates: np.ndarray, dim: int, keep: int
) -> tuple[np.ndarray, np.ndarray]:
    """Re-score each query's candidate ids at ``dim`` and keep the best ``keep``: (scores, ids) [Q, keep].

    Score ``⟨normalize(q[:dim]), normalize(x[:dim])⟩`` in float32; ties keep the candidates' order;
    id −1 (no candidate) scores −inf.
    """
    q_unit = unit_rows(queries[:, :dim])
    n_query, n_cand = candidates.shape
    scores = np.empty((n_query, keep), dtype=np.float32)
    ids = np.empty((n_query, keep), dtype=np.int64)
    chunk = max(1, RERANK_CHUNK_FLOATS // max(1, n_cand * dim))
    for lo in range(0, n_query, chunk):
        cand = candidates[lo : lo + chunk]
        rows = unit_rows(db[np.maximum(cand, 0).ravel(), :dim]).reshape(*cand.shape, dim)
        s = np.einsum("qd,qkd->qk", q_unit[lo : lo + chunk], rows)
        s[cand < 0] = -np.inf
        order = np.argsort(-s, axis=1, kind="stable")[:, :keep]
        scores[lo : lo + chunk] = np.take_along_axis(s, order, 1)
        ids[lo : lo + chunk] = np.take_along_axis(cand, order, 1)
    return scores, ids


def search(
    indexes: Mapping[int, FaissIndex | PrefixIVFIndex],
    queries: np.ndarray,
    k: int,
    *,
    dim: int | None = None,
    mode: str = "flat",
    shortlist: int = 200,
    cascade: Cascade | None = None,
    database: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k database rows of each query and their scores ``⟨normalize(q[:d]), normalize(x[:d])⟩``:
    (scores float32 [Q, k], rows int64 [Q, k]), best first. ``indexes`` maps a prefix dim to an index over
    that prefix of the database; ``queries`` are raw or unit rows [Q, ≥ dim].

    ``flat``: the index at ``dim`` (default: the largest indexed dim) over every row. ``adaptive`` and
    ``funnel``: the cascade of :func:`mode_cascade`; or an explicit ``cascade`` (its first shortlist from
    ``indexes[cascade.dims[0]]``). A cascade's re-ranks (:func:`rerank`) read ``database`` [N, ≥ dims[-1]]
    (raw or unit rows), its shortlists larger than N are cut to N, the last stage keeps k."""
    if cascade is None:
        dim = max(indexes) if dim is None else dim
        if dim not in indexes:
            raise ValueError(f"dim={dim}: the indexes have dims {sorted(indexes)}")
        cascade = mode_cascade(mode, list(indexes), dim, k, shortlist)
        if cascade is None:
            return indexes[dim].search(queries[:, :dim], k)
    if database is None:
        raise ValueError("adaptive and funnel search re-rank database rows: give database")
    n = len(database)
    sizes = [min(s, n) for s in cascade.shortlists]
    _, candidates = indexes[cascade.dims[0]].search(queries[:, : cascade.dims[0]], sizes[0])
    scores = np.empty((len(queries), 0), dtype=np.float32)
    for stage_dim, size in zip(cascade.dims[1:], [*sizes[1:], k], strict=False):
        scores, candidates = rerank(database, queries, candidates, stage_dim, size)
    return scores, candidates
