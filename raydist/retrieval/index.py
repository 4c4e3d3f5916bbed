"""Nearest-neighbour indexes by inner product on L2-normalised vectors: exact, HNSW and AdANNS-IVF.

Owns index construction, the CPU/GPU choice and the prefix-clustered IVF; faiss is imported lazily.
"""

from __future__ import annotations

import numpy as np

INDEX_KINDS = ("flat", "hnsw", "ivf-prefix")
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
