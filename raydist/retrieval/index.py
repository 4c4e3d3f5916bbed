"""Nearest-neighbour indexes by inner product on L2-normalised vectors: exact, HNSW and AdANNS-IVF.

Owns index construction, the CPU/GPU choice, the prefix-clustered IVF and the index folders ``raydist index``
writes (an index per prefix dim, the database's ids, ``indexes.json``); faiss is imported lazily.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raydist.retrieval.sets import RetrievalSet

INDEX_KINDS = ("flat", "hnsw", "ivf-prefix")
INDEX_META = "indexes.json"
DATABASE_IDS = "database_ids.npy"
# faiss prints "WARNING clustering N points to K centroids" on stderr (from C++, whatever its verbose flag) when
# there are fewer than 39 points per centroid; few points per list or per class are what we ask for.
QUIET_MIN_POINTS_PER_CENTROID = 1


def unit_rows(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """``x / max(‖x‖₂, eps)`` per row, as C-contiguous float32 (the layout faiss expects)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array [rows, dim], got shape {x.shape}")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.maximum(norms, eps))


def _check_search(queries: np.ndarray, dim: int, k: int) -> None:
    if queries.shape[1] != dim:
        raise ValueError(f"queries have dim {queries.shape[1]}, the index has dim {dim}")
    if k < 1:
        raise ValueError(f"k={k}: expected k >= 1")


def _gpu_wanted(use_gpu: bool | None) -> bool:
    """``use_gpu`` None or True: the GPU when faiss sees one; False: the CPU."""
    import faiss

    return use_gpu is not False and faiss.get_num_gpus() > 0


class FaissIndex:
    """A faiss index over unit vectors; ``search`` returns inner products (cosines), best first.

    ``device`` is ``"gpu"`` or ``"cpu"``. Missing results (k > number of vectors) have id −1.
    """

    def __init__(self, index, kind: str, device: str, resources=None) -> None:
        self.index = index
        self.kind = kind
        self.device = device
        self.dim = index.d
        self._resources = resources  # a GPU index must not outlive its StandardGpuResources

    @property
    def ntotal(self) -> int:
        return self.index.ntotal

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k of each query by ``⟨q/‖q‖, x⟩``: (scores float32 [Q, k], ids int64 [Q, k])."""
        queries = unit_rows(queries)
        _check_search(queries, self.dim, k)
        return self.index.search(queries, k)


class PrefixIVFIndex:
    """AdANNS-IVF (Rege et al. 2023): clusters on the first ``prefix_dim`` dims, lists scored at full dim.

    Build: spherical k-means on ``normalize(x[:, :prefix_dim])`` gives ``nlist`` centroids; each vector
    goes to the list of its highest-inner-product centroid. Search: the query prefix
    ``normalize(q[:, :prefix_dim])`` picks the ``nprobe`` best centroids; every vector in those lists
    is scored by the full-dim inner product ``⟨normalize(q), normalize(x)⟩`` and the top k are kept
    (slots left empty get id −1, score −inf). ``nprobe = nlist`` scores every vector: exact search.

    Search runs in faiss's ``IndexIVFFlat`` (C++, all queries at once): its quantizer holds the prefix
    centroids zero-padded to D, so a full-dim query scores ``⟨c, q[:prefix_dim]⟩``, a positive multiple
    of the prefix score: the same probes and the same list of every vector as the prefix search. ``lists``
    and ``coarse`` (the prefix-space centroids) stay for inspection. The coarse k-means runs on ``device``.
    """

    kind = "ivf-prefix"

    def __init__(
        self, vectors: np.ndarray, prefix_dim: int, nlist: int, nprobe: int, use_gpu: bool | None
    ) -> None:
        import faiss

        vectors = unit_rows(vectors)
        self.dim = vectors.shape[1]
        self.prefix_dim = prefix_dim
        self.nlist = nlist
        self.nprobe = nprobe
        gpu = _gpu_wanted(use_gpu)
        kmeans = faiss.Kmeans(
            prefix_dim,
            nlist,
            niter=20,
            seed=1234,
            spherical=True,
            gpu=gpu,
            min_points_per_centroid=QUIET_MIN_POINTS_PER_CENTROID,
        )
        kmeans.train(unit_rows(vectors[:, :prefix_dim]))
        self.coarse = build_index(kmeans.centroids, "flat", use_gpu=use_gpu)
        self.device = self.coarse.device
        padded = np.zeros((nlist, self.dim), dtype=np.float32)
        padded[:, :prefix_dim] = kmeans.centroids
        self._quantizer = faiss.IndexFlatIP(self.dim)
        self._quantizer.add(padded)
        self._ivf = faiss.IndexIVFFlat(self._quantizer, self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        self._ivf.add(vectors)  # each vector goes to its best prefix centroid (the padded quantizer's argmax)
        inv = self._ivf.invlists
        self.lists = [
            faiss.rev_swig_ptr(inv.get_ids(c), inv.list_size(c)).copy() for c in range(nlist)
        ]  # ascending
        self._ivf.nprobe = nprobe

    @property
    def nprobe(self) -> int:
        """Lists scored per query."""
        return self._nprobe

    @nprobe.setter
    def nprobe(self, value: int) -> None:
        self._nprobe = int(value)
        if hasattr(self, "_ivf"):
            self._ivf.nprobe = min(max(self._nprobe, 1), self.nlist)

    @property
    def ntotal(self) -> int:
        return int(self._ivf.ntotal)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k of each query over its ``nprobe`` lists: (scores float32 [Q, k], ids int64 [Q, k])."""
        queries = unit_rows(queries)
        _check_search(queries, self.dim, k)
        if not 1 <= self.nprobe <= self.nlist:
            raise ValueError(f"nprobe={self.nprobe}: expected 1 <= nprobe <= nlist={self.nlist}")
        scores, ids = self._ivf.search(queries, k)
        empty = ids < 0
        scores[empty] = -np.inf
        return scores, ids.astype(np.int64)


def build_index(
    vectors: np.ndarray,
    kind: str = "flat",
    *,
    hnsw_m: int = 32,
    ef_search: int = 128,
    ivf_lists: int | None = None,
    prefix_dim: int | None = None,
    nprobe: int | None = None,
    use_gpu: bool | None = None,
) -> FaissIndex | PrefixIVFIndex:
    """An inner-product index over ``normalize(vectors)`` ([N, D], any float dtype; stored as float32).

    ``"flat"``: exact (``IndexFlatIP``). ``"hnsw"``: ``IndexHNSWFlat`` with ``hnsw_m`` links per node and
    ``efSearch = ef_search``; always on the CPU (faiss has no GPU HNSW). ``"ivf-prefix"``: see
    :class:`PrefixIVFIndex`; ``ivf_lists`` defaults to ``round(√N)``, ``prefix_dim`` to D (plain IVF),
    ``nprobe`` to ``max(1, nlist // 8)`` (settable later as ``index.nprobe``). ``use_gpu`` None/True: the
    GPU when faiss sees one, else the CPU; the choice is the index's ``device``.
    """
    import faiss

    if kind not in INDEX_KINDS:
        raise ValueError(f"kind={kind!r}: expected one of {INDEX_KINDS}")
    vectors = unit_rows(vectors)
    n, dim = vectors.shape
    if n == 0:
        raise ValueError("cannot index an empty set of vectors")
    if kind == "ivf-prefix":
        prefix_dim = dim if prefix_dim is None else prefix_dim
        if not 1 <= prefix_dim <= dim:
            raise ValueError(f"prefix_dim={prefix_dim}: expected 1 <= prefix_dim <= {dim}")
        nlist = max(1, round(n**0.5)) if ivf_lists is None else ivf_lists
        if not 1 <= nlist <= n:
            raise ValueError(f"ivf_lists={nlist}: expected 1 <= ivf_lists <= {n} (number of vectors)")
        return PrefixIVFIndex(
            vectors, prefix_dim, nlist, max(1, nlist // 8) if nprobe is None else nprobe, use_gpu
        )
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = ef_search
        index.add(vectors)
        return FaissIndex(index, kind, "cpu")
    index = faiss.IndexFlatIP(dim)
    if _gpu_wanted(use_gpu):
        resources = faiss.StandardGpuResources()
        index = faiss.index_cpu_to_gpu(resources, 0, index)
        index.add(vectors)
        return FaissIndex(index, kind, "gpu", resources)
    index.add(vectors)
    return FaissIndex(index, kind, "cpu")


def check_dims(dims: Sequence[int], full: int) -> list[int]:
    """``dims`` sorted and de-duplicated; each must lie in [1, full]."""
    out = sorted({int(d) for d in dims})
    if not out or out[0] < 1 or out[-1] > full:
        raise ValueError(f"dims={list(dims)}: expected a non-empty list of dims in [1, {full}]")
    return out


def build_indexes(
    rset: RetrievalSet,
    dims: Sequence[int],
    kind: str = "flat",
    out_dir: str | Path | None = None,
    **index_options: Any,
) -> dict[int, FaissIndex | PrefixIVFIndex]:
    """One index per dim over ``normalize(database[:, :dim])`` (:func:`build_index`
    with ``index_options``). With ``out_dir``: ``index_d{dim}.faiss`` files (``faiss.write_index``, GPU
    indexes copied to the CPU first), ``database_ids.npy`` and ``indexes.json`` (dims, kind, checkpoint,
    split, direction, options); see :func:`load_indexes`. ``ivf-prefix`` indexes are not faiss objects and
    cannot be written."""
    dims = check_dims(dims, rset.dim)
    if out_dir is not None and kind == "ivf-prefix":
        raise ValueError("kind='ivf-prefix' lives in numpy and cannot be written; use 'flat' or 'hnsw'")
    indexes = {d: build_index(rset.database[:, :d], kind, **index_options) for d in dims}
    if out_dir is not None:
        import faiss

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = {}
        for d, index in indexes.items():
            files[d] = f"index_d{d}.faiss"
            native = faiss.index_gpu_to_cpu(index.index) if index.device == "gpu" else index.index
            faiss.write_index(native, str(out / files[d]))
        np.save(out / DATABASE_IDS, rset.database_ids)
        meta = {
            "kind": kind,
            "dims": dims,
            "files": {str(d): f for d, f in files.items()},
            "checkpoint": rset.source,
            "split": rset.split,
            "task": rset.task,
            "direction": rset.direction,
            "num_database": len(rset.database),
            "index_options": index_options,
        }
        (out / INDEX_META).write_text(json.dumps(meta, indent=1))
    return indexes


def load_indexes(out_dir: str | Path) -> tuple[dict[int, FaissIndex], dict[str, Any]]:
    """The indexes :func:`build_indexes` wrote (on the CPU) and its ``indexes.json``, with the database's
    dataset ids under ``"database_ids"``."""
    import faiss

    out = Path(out_dir)
    meta = json.loads((out / INDEX_META).read_text())
    indexes = {
        int(d): FaissIndex(faiss.read_index(str(out / f)), meta["kind"], "cpu")
        for d, f in meta["files"].items()
    }
    return indexes, {**meta, "database_ids": np.load(out / DATABASE_IDS)}
