"""Retrieval metrics of the nested (Matryoshka) embeddings of a trained model
(docs/algorithms.md#adaptive-and-funnel-retrieval): an embedded split (a
:class:`raydist.retrieval.sets.RetrievalSet`, made by a task's ``embed``) indexed at its re-normalised prefixes
(:mod:`raydist.retrieval.index`) and searched (:func:`raydist.retrieval.search.search`), scored single-shot,
adaptive, funnel and against baselines per dim.

The ``evaluate_*`` functions return flat rows (method, dims, metrics, MFLOPs/query, ms/query) that
:mod:`raydist.eval.retrieval_plots` renders; faiss and matplotlib are imported lazily.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from raydist.eval.adaptive import mflops_per_query, project_first_m, project_random, project_svd
from raydist.eval.label_metrics import map_at_k, precision_at_k
from raydist.eval.retrieval_plots import (
    cost_panels,
    format_table,
    main_metric,
    plot_metric_vs_dim,
    plot_metric_vs_mflops,
)
from raydist.retrieval.index import FaissIndex, PrefixIVFIndex, build_index, build_indexes, check_dims
from raydist.retrieval.search import Cascade, default_funnel, search
from raydist.retrieval.sets import RetrievalSet

BASELINES = ("first-m", "svd", "jl")
PAIRS_RECALLS = (1, 5, 10)
T = TypeVar("T")


def default_dims(full: int) -> list[int]:
    """The powers of two from 8 below ``full``, then ``full`` itself."""
    return [*(1 << p for p in range(3, full.bit_length()) if 1 << p < full), full]


def interpolated_dims(dims: Sequence[int]) -> list[int]:
    """Dims between consecutive (trained) dims a < b: the geometric midpoint ``round(√(a·b))``, kept when
    it lies strictly between a and b (the nested model was never trained at these prefix lengths)."""
    ordered = sorted(dims)
    mids = [round(math.sqrt(a * b)) for a, b in itertools.pairwise(ordered)]
    return [m for m, (a, b) in zip(mids, itertools.pairwise(ordered), strict=False) if a < m < b]


def drop_self(ids: np.ndarray, k: int) -> np.ndarray:
    """The first k ids of each row other than the row's own index (leave-one-out), order kept."""
    own = ids == np.arange(len(ids))[:, None]
    return np.take_along_axis(ids, np.argsort(own, axis=1, kind="stable")[:, :k], 1)


def search_ids(
    index: FaissIndex | PrefixIVFIndex, queries: np.ndarray, k: int, exclude_self: bool
) -> np.ndarray:
    """Top-k database rows of each query [Q, k], best first, by flat search of ``index``
    (:func:`raydist.retrieval.search.search`; k + 1 searched, then :func:`drop_self`)."""
    _, ids = search({index.dim: index}, queries, k + int(exclude_self))
    return drop_self(ids, k) if exclude_self else ids


def cascade_ids(
    rset: RetrievalSet,
    cascade: Cascade,
    k: int,
    index: FaissIndex | PrefixIVFIndex | None = None,
    kind: str = "flat",
) -> np.ndarray:
    """Top-k rows [Q, k] by the funnel ``cascade`` (:class:`raydist.retrieval.search.Cascade`, searched by
    :func:`raydist.retrieval.search.search`): the shortlist comes from ``index`` (an index over ``dims[0]``;
    built with ``kind`` when None). Shortlists larger than N are cut to N; with ``exclude_self`` the
    query's own row stays in the lists (it scores 1) and is dropped at the end."""
    n = len(rset.database)
    keep = k + int(rset.exclude_self)
    check_dims(cascade.dims, rset.dim)
    if not keep <= n or min(cascade.shortlists) < keep:
        raise ValueError(
            f"shortlists={cascade.shortlists}, k={k}: every shortlist and N={n} must hold "
            f"{keep} rows (k, plus the query itself when it is in the database)"
        )
    index = build_index(rset.database[:, : cascade.dims[0]], kind) if index is None else index
    _, candidates = search(
        {cascade.dims[0]: index}, rset.queries, keep, cascade=cascade, database=rset.database
    )
    return drop_self(candidates, k) if rset.exclude_self else candidates


def cascade_mflops(num_database: int, cascade: Cascade) -> float:
    """MFLOPs/query of a funnel: ``(N·D_s + Σ_i min(s_i, N)·D_{i+1}) / 10⁶``."""
    sizes = [min(s, num_database) for s in cascade.shortlists]
    return mflops_per_query(num_database, cascade.dims[0], zip(sizes, cascade.dims[1:], strict=False))


def retrieval_scores(rset: RetrievalSet, ids: np.ndarray, k: int = 10) -> dict[str, float]:
    """Metrics (%) of retrieved rows ``ids`` [Q, ≥k]. Two-way: ``{prefix}r{K}`` for K in 1, 5, 10 (a query
    counts when a relevant row is among its first K: the best caption of an image for i2t, the VSE++
    protocol); one-way: ``nn1`` (1-NN label accuracy), ``p{k}``, ``map{k}``
    (:mod:`raydist.eval.label_metrics`)."""
    retrieved = rset.database_keys[ids]
    if rset.two_way:
        if ids.shape[1] < max(PAIRS_RECALLS):
            raise ValueError(
                f"R@{max(PAIRS_RECALLS)} needs {max(PAIRS_RECALLS)} retrieved rows, got {ids.shape[1]}"
            )
        hit = np.logical_or.accumulate(retrieved == rset.query_keys[:, None], axis=1)
        return {f"{rset.prefix}r{r}": 100.0 * float(hit[:, r - 1].mean()) for r in PAIRS_RECALLS}
    return {
        "nn1": 100.0 * float((retrieved[:, 0] == rset.query_keys).mean()),
        f"p{k}": precision_at_k(retrieved, rset.query_keys, k),
        f"map{k}": map_at_k(retrieved, rset.query_keys, k),
    }


def timed(repeats: int, fn: Callable[..., T], *args: Any) -> tuple[T, float]:
    """``fn(*args)``'s result and its best wall time in seconds over ``repeats`` calls."""
    best = math.inf
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        out = fn(*args)
        best = min(best, time.perf_counter() - start)
    return out, best


def _measure(
    rset: RetrievalSet,
    row: dict[str, Any],
    mflops: float,
    k: int,
    repeats: int,
    fn: Callable[..., np.ndarray],
    *args: Any,
) -> None:
    """Add to ``row`` the metrics of ``fn(*args)``'s ids, its MFLOPs/query and its batched wall ms/query."""
    ids, seconds = timed(repeats, fn, *args)
    row.update(retrieval_scores(rset, ids, k))
    row[f"{rset.prefix}mflops"] = mflops
    row[f"{rset.prefix}ms_per_query"] = 1e3 * seconds / len(rset.queries)


def _add_rsum(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = [f"{d}_r{r}" for d in ("i2t", "t2i") for r in PAIRS_RECALLS]
    for row in rows:
        if all(key in row for key in keys):
            row["rsum"] = sum(row[key] for key in keys)
    return rows


def evaluate_dims(
    rset: RetrievalSet,
    dims: Sequence[int],
    *,
    kind: str = "flat",
    k: int = 10,
    interpolate: bool = True,
    repeats: int = 1,
    **index_options: Any,
) -> list[dict[str, Any]]:
    """Single-shot search of the whole database at each dim (and at :func:`interpolated_dims`, rows with
    ``interpolated=True``): one row per dim with every direction's metrics, pairs ``rsum``, MFLOPs/query
    ``N·dim/10⁶`` (the exhaustive-scan cost, whatever ``kind``) and batched wall ms/query (search only)."""
    dims = check_dims(dims, rset.dim)
    every = sorted({*dims, *interpolated_dims(dims)}) if interpolate else dims
    rows = [{"method": "single", "dim": d, "interpolated": d not in dims} for d in every]
    for direction in rset.directions():
        indexes = build_indexes(direction, every, kind, **index_options)
        for row in rows:
            d = row["dim"]
            _measure(
                direction,
                row,
                mflops_per_query(len(direction.database), d),
                k,
                repeats,
                search_ids,
                indexes[d],
                direction.queries[:, :d],
                k,
                direction.exclude_self,
            )
    return _add_rsum(rows)


def evaluate_cascades(
    rset: RetrievalSet,
    cascades: Sequence[Cascade],
    *,
    method: str = "funnel",
    kind: str = "flat",
    k: int = 10,
    repeats: int = 1,
    **index_options: Any,
) -> list[dict[str, Any]]:
    """One row per cascade (:func:`cascade_ids`; ``method`` names it): ``dim`` (last stage), ``cascade``
    (``"16>32>64"``), ``shortlists``, metrics, :func:`cascade_mflops` and batched wall ms/query (shortlist
    search + re-ranks; the shortlist index is built beforehand, outside the timing)."""
    rows = [
        {
            "method": method,
            "dim": c.dims[-1],
            "cascade": ">".join(map(str, c.dims)),
            "shortlists": ">".join(map(str, c.shortlists)),
        }
        for c in cascades
    ]
    first = check_dims([c.dims[0] for c in cascades], rset.dim)
    for direction in rset.directions():
        indexes = build_indexes(direction, first, kind, **index_options)
        for row, c in zip(rows, cascades, strict=False):
            _measure(
                direction,
                row,
                cascade_mflops(len(direction.database), c),
                k,
                repeats,
                cascade_ids,
                direction,
                c,
                k,
                indexes[c.dims[0]],
            )
    return _add_rsum(rows)


def evaluate_adaptive(
    rset: RetrievalSet,
    dim_pairs: Sequence[tuple[int, int]],
    *,
    shortlist: int = 200,
    kind: str = "flat",
    k: int = 10,
    repeats: int = 1,
    **index_options: Any,
) -> list[dict[str, Any]]:
    """Adaptive retrieval for each ``(D_s, D_r)``: shortlist ``shortlist`` rows at D_s, re-rank at D_r
    (rows as :func:`evaluate_cascades`, ``method="adaptive"``, plus ``shortlist_dim``)."""
    cascades = [Cascade((ds, dr), (shortlist,)) for ds, dr in dim_pairs]
    rows = evaluate_cascades(
        rset, cascades, method="adaptive", kind=kind, k=k, repeats=repeats, **index_options
    )
    return [{**row, "shortlist_dim": c.dims[0]} for row, c in zip(rows, cascades, strict=False)]


def baseline_projection(rset: RetrievalSet, method: str, m: int, seed: int = 0) -> np.ndarray | None:
    """The map ``P`` [D, m] of a baseline (None for ``first-m``, which keeps ``x[:, :m]``): ``svd`` is fit on
    the database (:func:`raydist.eval.adaptive.project_svd`), ``jl`` is a Gaussian JL map (``seed``)."""
    if method == "first-m":
        return None
    if method == "svd":
        return project_svd(rset.database, m)
    if method == "jl":
        return project_random(rset.dim, m, seed)
    raise ValueError(f"baseline {method!r}: expected one of {BASELINES}")


def _reduce(x: np.ndarray, m: int, proj: np.ndarray | None) -> np.ndarray:
    return project_first_m(x, m) if proj is None else x @ proj


def _reduced_search(
    index: FaissIndex | PrefixIVFIndex, rset: RetrievalSet, m: int, proj: np.ndarray | None, k: int
) -> np.ndarray:
    """Project the queries to m dims, then :func:`search_ids` (both timed for a baseline)."""
    return search_ids(index, _reduce(rset.queries, m, proj), k, rset.exclude_self)


def evaluate_baselines(
    rset: RetrievalSet,
    dims: Sequence[int],
    *,
    methods: Sequence[str] = BASELINES,
    kind: str = "flat",
    k: int = 10,
    seed: int = 0,
    repeats: int = 1,
    **index_options: Any,
) -> list[dict[str, Any]]:
    """Reduce a non-nested model's embeddings to m dims per method and search exhaustively at m: one row per
    (method, m). The map is fit once on ``rset``'s database (pairs: the images) and applied to both
    modalities; ``svd`` rows with m > min(N, D) are left out. MFLOPs/query add the query projection, ``D·m``;
    the wall time counts projecting the queries and searching."""
    dims = check_dims(dims, rset.dim)
    rows = []
    for method in methods:
        for m in dims:
            if method == "svd" and m > min(rset.database.shape):
                continue
            proj = baseline_projection(rset, method, m, seed)
            row: dict[str, Any] = {"method": method, "dim": m}
            for direction in rset.directions():
                index = build_index(_reduce(direction.database, m, proj), kind, **index_options)
                projecting = 0 if proj is None else rset.dim * m / 1e6
                cost = mflops_per_query(len(direction.database), m) + projecting
                _measure(direction, row, cost, k, repeats, _reduced_search, index, direction, m, proj, k)
            rows.append(row)
    return _add_rsum(rows)


def retrieval_report(
    rset: RetrievalSet,
    *,
    dims: Sequence[int] | None = None,
    kind: str = "flat",
    baseline: RetrievalSet | None = None,
    out_dir: str | Path | None = None,
    shortlist: int = 200,
    funnel: tuple[Sequence[int], Sequence[int]] | None = None,
    k: int = 10,
    repeats: int = 1,
    **index_options: Any,
) -> dict[str, Any]:
    """Everything above for one embedded split: single-shot rows at ``dims`` (default :func:`default_dims`)
    and their interpolated dims, adaptive ``(D_s, D)`` for every D_s < D, one funnel (``(dims, shortlists)``,
    default :func:`default_funnel`), and with ``baseline`` (the same split embedded by a non-nested model of
    the same task) the first-m / SVD / JL baselines. With ``out_dir``: ``retrieval.txt`` (the table),
    ``retrieval.json`` (the rows), ``metric_vs_dim.png`` and ``metric_vs_mflops.png``. Returns ``task``,
    ``checkpoint``, ``split``, ``dims``, ``kind``, ``rows``, ``table`` and ``files`` (name → path; empty
    without out_dir)."""
    dims = default_dims(rset.dim) if dims is None else check_dims(dims, rset.dim)
    options = {"kind": kind, "k": k, "repeats": repeats, **index_options}
    rows = evaluate_dims(rset, dims, **options)
    below = [d for d in dims if d < rset.dim]
    if below:
        rows += evaluate_adaptive(rset, [(d, rset.dim) for d in below], shortlist=shortlist, **options)
    if funnel is not None or below:
        cascade = Cascade(*map(tuple, funnel)) if funnel else default_funnel(dims, rset.dim, shortlist, k)
        rows += evaluate_cascades(rset, [cascade], method="funnel", **options)
    if baseline is not None:
        if (baseline.task, baseline.split) != (rset.task, rset.split):
            raise ValueError(
                f"the baseline embeds {baseline.split!r} of a {baseline.task!r} task, the checkpoint "
                f"{rset.split!r} of a {rset.task!r} task"
            )
        rows += evaluate_baselines(
            baseline, [d for d in dims if d <= baseline.dim] or [baseline.dim], **options
        )
    table = format_table(rows)
    files: dict[str, str] = {}
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = {
            name: str(out / name)
            for name in ("retrieval.txt", "retrieval.json", "metric_vs_dim.png", "metric_vs_mflops.png")
        }
        (out / "retrieval.txt").write_text(table + "\n")
        (out / "retrieval.json").write_text(json.dumps(rows, indent=1))
        plot_metric_vs_dim(rows, out / "metric_vs_dim.png", main_metric(rset.two_way, k))
        plot_metric_vs_mflops(rows, out / "metric_vs_mflops.png", cost_panels(rset.two_way, k))
    return {
        "task": rset.task,
        "checkpoint": rset.source,
        "split": rset.split,
        "dims": dims,
        "kind": kind,
        "rows": rows,
        "table": table,
        "files": files,
    }
