"""Benchmark of retrieval with a trained nested (Matryoshka) embedding ("retrieval", issue #10): wall time
per query and recall of flat full-D search, adaptive retrieval, the MRL funnel, HNSW and prefix-IVF.

What is measured (full mode; smoke mode is the same at tiny sizes, :data:`SMOKE`):

1. **Model.** A planted generator (:class:`Planted`): latent points ``z ∈ R^32`` around 512 random
   centres (``z = μ_c + 0.6·ε``), inputs ``x = tanh((z + σ·ν) A + b) ∈ R^128`` with a fixed random ``A``,
   ``b``; ``σ = 0`` gives an item's clean input, ``σ = 0.35`` a noisy view of it. An MLP encoder
   128 → 512 → ReLU → 1024 is trained in-process (no Ray, one torch thread) for 150 Adam steps (lr 1e-3,
   batches of 256 pairs of two noisy views of the same latent) on raydist's Matryoshka loss
   ``nested_loss(ranking_loss SH, margin 0.2, mean)`` over the prefixes 16, 32, …, 1024.
2. **Data.** Database: the encoder outputs of the clean inputs of N = 100,000 fresh latents, [N, 1024].
   Queries: Q = 1000 of those items, drawn without replacement, each seen through a fresh noisy view and
   encoded, [Q, 1024]. Raw outputs are stored; every method re-normalises the prefixes it uses.
3. **Methods** (k = 10, inner product on L2-normalised prefixes, all on the CPU):
   ``flat D`` exact search (faiss ``IndexFlatIP`` at 1024) — the reference; ``adaptive D_s→D``:
   ``IndexFlatIP`` over ``normalize(x[:, :D_s])`` for a shortlist of 200, then an exact re-rank at D of the
   shortlist rows (faiss's ``knn_inner_products_by_idx``, which reads each candidate row in place;
   :func:`cascade_search`), D_s ∈ {16, 32, 64}; ``funnel``: the MRL funnel
   16→32→64→128→1024 keeping 200, 100, 50, 25 (:func:`raydist.retrieval.search.default_funnel`); ``hnsw D``:
   faiss ``IndexHNSWFlat`` at 1024, M = 32, efSearch 128; ``ivf-prefix D_s``: raydist's AdANNS-IVF
   (:class:`raydist.retrieval.index.PrefixIVFIndex`): √N lists clustered on the 16-dim prefix,
   ``nprobe`` = 8 lists chosen by the query's 16-dim prefix, candidates scored at full D; ``adaptive ivf
   d_c→D`` (the AdANNS setting, :func:`ivf_cascade_methods`): the shortlist of 200 (or 100) comes from a
   plain IVF over ``normalize(x[:, :64])`` (1024 lists, nprobe 4–32) instead of a scan of all N, then the
   same exact re-rank at D; ``funnel ivf 64→256→1024``: that shortlist re-ranked at 256 keeping 50, then at
   1024. The adaptive and
   funnel rankings are those of :func:`raydist.eval.adaptive.funnel_retrieval` (tests/test_bench_retrieval.py
   checks it); the unit prefixes they re-rank are computed once with the index, outside the timing.
4. **Quality**, from one untimed pass over all Q queries: ``exact R@10`` = mean over queries of
   |method's top-10 ∩ flat-D top-10| / 10 (the recall lost against exact full-D search; flat D is 100 by
   definition) and ``task R@10`` = % of queries whose own database item is in the method's top 10.
5. **Time**, ms per query: ``batched`` = one call with all Q queries / Q; ``one at a time`` = the first 50
   queries searched one call each / 50. Both include normalising the query prefixes. Prefix-IVF searches
   query by query in a Python loop whatever the batch, so its batched time uses the first 100 queries
   only (its quality pass uses all Q). ``repeats`` rounds,
   every method interleaved in each round, after the quality pass (the warm-up); median (min–max).
   Speedup = flat D's median / the method's median, from the same run. faiss and torch run with one
   thread (:data:`THREADS`): on the shared 2-core box two OpenMP threads spinning against other jobs made
   flat search 4–10× slower in trial runs. Index build times are reported once (untimed by the rounds).
6. **k-selection** (:func:`selection_table`): the flat shortlist's top 200 of N scores at D_s = 32, all Q
   queries in one call, by faiss's flat search with its reservoir (its default for k ≥ 100) and with its
   heap, numpy matmul + argpartition and torch mm + topk (blocks of 256 queries), next to the matmul alone.
7. **Cost**: MFLOPs/query by :func:`raydist.eval.adaptive.mflops_per_query` (N·D_s + Σ k_i·D_i; flat:
   N·D); HNSW: faiss's count of distance computations × D; prefix-IVF: nlist·D_s for the coarse step +
   the mean number of candidates × D. The ``MFLOPs ratio`` is flat's MFLOPs / the method's.

Target (issue #10, after the MRL paper's ~14× wall-clock): adaptive ≥ 10× faster than flat D with at most
0.5 point of exact R@10 lost; the verdict line above the table is computed from the measured rows.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from raydist.benchmarks.catalog import register_benchmark
from raydist.benchmarks.harness import ms_spread, seconds
from raydist.eval.adaptive import mflops_per_query
from raydist.eval.retrieve import cascade_mflops
from raydist.losses import ranking_loss
from raydist.losses.nested import nested_loss
from raydist.retrieval.index import build_index, unit_rows
from raydist.retrieval.search import Cascade, default_funnel

K = 10
SHORTLIST = 200
THREADS = 1  # faiss OpenMP and torch threads while training and searching (restored afterwards)
LATENT, INPUT, CLUSTERS, SPREAD, VIEW_NOISE = 32, 128, 512, 0.6, 0.35
MARGIN, LR = 0.2, 1e-3
TARGET_SPEEDUP, TARGET_LOST = 10.0, 0.5


@dataclass(frozen=True)
class Sizes:
    database: int  # N
    queries: int  # Q: quality and batched timing
    single: int  # the first `single` queries are also timed one call each
    dim: int  # D
    nesting: tuple[int, ...]  # the trained prefixes (the last is D)
    shortlist_dims: tuple[int, ...]  # adaptive D_s
    steps: int
    batch: int = 256
    hidden: int = 512
    ivf_prefix_dim: int = 16
    ivf_nprobe: int = 8
    hnsw_m: int = 32
    ef_search: int = 128
    coarse_dim: int = 64  # d_c of the IVF shortlist (adaptive-ivf rows)
    coarse_lists: int = 1024
    coarse_probes: tuple[int, ...] = (4, 8, 16, 32)  # nprobe of the adaptive-ivf rows (shortlist 200)
    coarse_small: tuple[int, int] = (16, 100)  # (nprobe, shortlist) of the row with the smaller shortlist
    coarse_funnel: tuple[tuple[int, ...], tuple[int, ...]] = ((64, 256, 1024), (200, 50))  # IVF funnel
    topk_dims: tuple[int, ...] = (32, 64)  # adaptive D_s→D rows whose flat shortlist is torch mm + topk
    selection_dim: int = 32  # D_s of the k-selection table
    selection_chunk: int = 256  # queries per score block in the numpy/torch selections


FULL = Sizes(100_000, 1000, 50, 1024, (16, 32, 64, 128, 256, 512, 1024), (16, 32, 64), steps=150)
SMOKE = Sizes(
    2000,
    30,
    5,
    64,
    (16, 32, 64),
    (16, 32),
    steps=4,
    batch=64,
    hidden=64,
    coarse_dim=16,
    coarse_lists=32,
    coarse_probes=(2, 8),
    coarse_small=(8, 50),
    coarse_funnel=((16, 32, 64), (200, 50)),
    topk_dims=(16,),
    selection_dim=16,
    selection_chunk=16,
)


class Planted:
    """Latent clusters seen through a fixed random nonlinear map (module docstring, step 1)."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.mix = (rng.standard_normal((LATENT, INPUT)) / np.sqrt(LATENT * (1 + SPREAD**2))).astype(
            np.float32
        )
        self.bias = rng.uniform(-0.5, 0.5, INPUT).astype(np.float32)
        self.centres = rng.standard_normal((CLUSTERS, LATENT)).astype(np.float32)

    def latents(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """[n, LATENT]: a random centre plus Gaussian spread per row."""
        centres = self.centres[rng.integers(0, CLUSTERS, n)]
        return centres + SPREAD * rng.standard_normal((n, LATENT), dtype=np.float32)

    def inputs(self, z: np.ndarray, rng: np.random.Generator, noise: float) -> np.ndarray:
        """``tanh((z + noise·ν) A + b)`` [n, INPUT] float32 (``noise=0``: the item's clean input)."""
        if noise:
            z = z + noise * rng.standard_normal(z.shape, dtype=np.float32)
        return np.tanh(z @ self.mix + self.bias).astype(np.float32)


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """torch and faiss (OpenMP) use ``n`` threads inside the block; the previous counts are restored."""
    import faiss

    before_torch, before_faiss = torch.get_num_threads(), faiss.omp_get_max_threads()
    torch.set_num_threads(n)
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before_torch)
        faiss.omp_set_num_threads(before_faiss)


def train_encoder(sizes: Sizes, planted: Planted, seed: int = 0) -> tuple[torch.nn.Module, float]:
    """The nested MLP encoder after ``sizes.steps`` Adam steps on the Matryoshka SH loss; its last loss."""
    rng = np.random.default_rng(seed + 1)
    with torch.random.fork_rng():  # seeded initialisation without changing the caller's torch RNG
        torch.manual_seed(seed)
        encoder = torch.nn.Sequential(
            torch.nn.Linear(INPUT, sizes.hidden), torch.nn.ReLU(), torch.nn.Linear(sizes.hidden, sizes.dim)
        )
    optimizer = torch.optim.Adam(encoder.parameters(), lr=LR)
    loss_fn = nested_loss(
        lambda a, p: ranking_loss(a, p, margin=MARGIN, hardest=False, reduction="mean"), sizes.nesting
    )
    loss = torch.zeros(())
    for _ in range(sizes.steps):
        z = planted.latents(sizes.batch, rng)
        views = [encoder(torch.from_numpy(planted.inputs(z, rng, VIEW_NOISE))) for _ in range(2)]
        loss = loss_fn(views)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return encoder.eval(), float(loss.detach())


@torch.no_grad()
def embed_data(
    sizes: Sizes, planted: Planted, encoder: torch.nn.Module, seed: int = 2, chunk: int = 8192
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw database [N, D] (clean inputs), queries [Q, D] (noisy views of Q database items) and the
    database row of each query [Q]."""
    rng = np.random.default_rng(seed)
    z = planted.latents(sizes.database, rng)
    database = np.concatenate(
        [
            encoder(torch.from_numpy(planted.inputs(z[lo : lo + chunk], rng, 0.0))).numpy()
            for lo in range(0, sizes.database, chunk)
        ]
    )
    targets = rng.choice(sizes.database, sizes.queries, replace=False)
    queries = encoder(torch.from_numpy(planted.inputs(z[targets], rng, VIEW_NOISE))).numpy()
    return database, queries, targets


def rerank_unit(units: np.ndarray, q_unit: np.ndarray, candidates: np.ndarray, keep: int) -> np.ndarray:
    """Ids [Q, keep] of the best ``keep`` candidates by ``units[c] · q_unit`` (rows already unit length), best
    first: faiss's ``knn_inner_products_by_idx`` (C++, each candidate row read in place, no gathered copy).
    Id −1 ends a row's candidates (faiss's padding of a short IVF shortlist); empty slots come back as −1."""
    candidates = np.ascontiguousarray(candidates, dtype=np.int64)
    empty = candidates < 0
    if np.any(empty[:, :-1] & ~empty[:, 1:]):
        raise ValueError("candidate id -1 before a valid id: -1 may only pad the end of a row")
    import faiss

    n_query, n_cand = candidates.shape
    units, q_unit = (np.ascontiguousarray(x, dtype=np.float32) for x in (units, q_unit))
    scores = np.empty((n_query, keep), dtype=np.float32)
    out = np.empty((n_query, keep), dtype=np.int64)
    faiss.knn_inner_products_by_idx(
        faiss.swig_ptr(q_unit),
        faiss.swig_ptr(units),
        faiss.swig_ptr(candidates),
        units.shape[1],
        n_query,
        units.shape[0],
        n_cand,
        keep,
        faiss.swig_ptr(scores),
        faiss.swig_ptr(out),
        n_cand,
    )
    return out


def unit_prefixes(database: np.ndarray, dims: Sequence[int]) -> dict[int, np.ndarray]:
    """``{d: normalize(database[:, :d])}``: what a cascade re-ranks (computed once, with the index)."""
    return {d: unit_rows(database[:, :d]) for d in sorted(set(dims))}


def cascade_search(index, units: dict[int, np.ndarray], queries: np.ndarray, cascade: Cascade, k: int = K):
    """Top-k ids [Q, k] of a funnel: ``index`` (over ``normalize(db[:, :dims[0]])``) gives the first
    shortlist, each later stage re-ranks at its dim with :func:`rerank_unit` (the ranking of
    :func:`raydist.eval.adaptive.funnel_retrieval`). Shortlists must not exceed N."""
    dims, sizes = cascade.dims, cascade.shortlists
    _, candidates = index.search(queries[:, : dims[0]], sizes[0])
    for dim, keep in zip(dims[1:], [*sizes[1:], k], strict=False):
        candidates = rerank_unit(units[dim], unit_rows(queries[:, :dim]), candidates, keep)
    return candidates


class TorchTopkIndex:
    """Exact inner-product top-k over ``normalize(vectors)`` by torch: ``q @ xᵀ`` for a block of ``chunk``
    queries, then ``torch.topk`` (best first); the same ``search`` interface as the faiss indexes."""

    def __init__(self, vectors: np.ndarray, chunk: int) -> None:
        self.units, self.chunk = torch.from_numpy(unit_rows(vectors)), chunk

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores float32 [Q, k], ids int64 [Q, k]) of each query's top k by ``⟨q/‖q‖, x⟩``."""
        q = torch.from_numpy(unit_rows(queries))
        tops = [
            torch.topk(q[lo : lo + self.chunk] @ self.units.T, k, dim=1)
            for lo in range(0, len(q), self.chunk)
        ]
        return torch.cat([t.values for t in tops]).numpy(), torch.cat([t.indices for t in tops]).numpy()


@dataclass
class Method:
    name: str
    search: Callable[[np.ndarray], np.ndarray]  # raw queries [q, D] -> ids [q, K]
    mflops: float
    build_s: float
    batch_cap: int | None = None  # batched timing on the first batch_cap queries (None: all Q)


def _built(build: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    out = build()
    return out, time.perf_counter() - start


def cascade_methods(database: np.ndarray, sizes: Sizes) -> list[Method]:
    """flat D, adaptive D_s→D for every ``sizes.shortlist_dims`` and the MRL funnel (mflops without
    index build times for the prefixes shared with others)."""
    n, full = database.shape
    flat, flat_s = _built(lambda: build_index(database, "flat", use_gpu=False))
    methods = [Method(f"flat {full}", lambda q: flat.search(q, K)[1], mflops_per_query(n, full), flat_s)]
    funnel = default_funnel(sizes.nesting, full, SHORTLIST, K)
    starts = sorted({*sizes.shortlist_dims, funnel.dims[0]})
    built = {d: _built(lambda d=d: build_index(database[:, :d], "flat", use_gpu=False)) for d in starts}
    units, units_s = _built(lambda: unit_prefixes(database, [full, *funnel.dims[1:]]))
    for ds in sizes.shortlist_dims:
        cascade = Cascade((ds, full), (SHORTLIST,))
        index, build_s = built[ds]
        methods.append(
            Method(
                f"adaptive {ds}→{full}",
                lambda q, i=index, c=cascade: cascade_search(i, units, q, c),
                cascade_mflops(n, cascade),
                build_s + units_s,
            )
        )
    for ds in sizes.topk_dims:
        cascade = Cascade((ds, full), (SHORTLIST,))
        index, build_s = _built(lambda ds=ds: TorchTopkIndex(database[:, :ds], sizes.selection_chunk))
        methods.append(
            Method(
                f"adaptive {ds}→{full}, torch topk shortlist",
                lambda q, i=index, c=cascade: cascade_search(i, units, q, c),
                cascade_mflops(n, cascade),
                build_s + units_s,
            )
        )
    index, build_s = built[funnel.dims[0]]
    methods.append(
        Method(
            "funnel " + "→".join(map(str, funnel.dims)),
            lambda q: cascade_search(index, units, q, funnel),
            cascade_mflops(n, funnel),
            build_s + units_s,
        )
    )
    return methods


def _probed(
    index, nprobe: int, search: Callable[[np.ndarray], np.ndarray]
) -> Callable[[np.ndarray], np.ndarray]:
    """``search`` with ``index.nprobe = nprobe`` set first (rows that share one IVF index)."""

    def run(queries: np.ndarray) -> np.ndarray:
        index.nprobe = nprobe
        return search(queries)

    return run


def ivf_cascade_methods(database: np.ndarray, queries: np.ndarray, sizes: Sizes) -> list[Method]:
    """Adaptive retrieval with an IVF shortlist (the AdANNS setting): a plain IVF over
    ``normalize(x[:, :d_c])`` (``coarse_lists`` lists) gives the shortlist at d_c from ``nprobe`` lists, an
    exact re-rank at D (or a funnel through larger prefixes) gives the top k. MFLOPs: nlist·d_c for the probe
    choice, the mean number of vectors in the probed lists (on ``queries``) · d_c, Σ shortlist·D_i."""
    full = database.shape[1]
    dc = sizes.coarse_dim
    dims = {full, *sizes.coarse_funnel[0][1:]}
    index, build_s = _built(
        lambda: build_index(database[:, :dc], "ivf-prefix", ivf_lists=sizes.coarse_lists, use_gpu=False)
    )
    units, units_s = _built(lambda: unit_prefixes(database, sorted(dims)))
    list_sizes = np.array([len(ids) for ids in index.lists])

    def method(name: str, nprobe: int, cascade: Cascade) -> Method:
        _, probes = index.coarse.search(queries[:, :dc], nprobe)
        scanned = round(float(list_sizes[probes].sum(1).mean()))
        rerank = list(zip(cascade.shortlists, cascade.dims[1:], strict=False))
        cost = mflops_per_query(index.nlist, dc, [(scanned, dc), *rerank])
        search = _probed(index, nprobe, lambda q: cascade_search(index, units, q, cascade))
        return Method(
            f"{name} ({index.nlist} lists, nprobe {nprobe}, shortlist {cascade.shortlists[0]})",
            search,
            cost,
            build_s + units_s,
        )

    label = f"adaptive ivf {dc}→{full}"
    rows = [method(label, p, Cascade((dc, full), (SHORTLIST,))) for p in sizes.coarse_probes]
    probe, short = sizes.coarse_small
    rows.append(method(label, probe, Cascade((dc, full), (short,))))
    funnel = Cascade(*sizes.coarse_funnel)
    rows.append(method("funnel ivf " + "→".join(map(str, funnel.dims)), probe, funnel))
    return rows


def ann_methods(database: np.ndarray, queries: np.ndarray, sizes: Sizes) -> list[Method]:
    """HNSW at D and prefix-IVF (AdANNS) with their measured MFLOPs/query on ``queries``."""
    import faiss

    full = database.shape[1]
    hnsw, hnsw_s = _built(
        lambda: build_index(database, "hnsw", hnsw_m=sizes.hnsw_m, ef_search=sizes.ef_search)
    )
    faiss.cvar.hnsw_stats.reset()
    hnsw.search(queries, K)
    hnsw_mflops = faiss.cvar.hnsw_stats.ndis / len(queries) * full / 1e6
    ds = sizes.ivf_prefix_dim
    ivf, ivf_s = _built(
        lambda: build_index(database, "ivf-prefix", prefix_dim=ds, nprobe=sizes.ivf_nprobe, use_gpu=False)
    )
    _, probes = ivf.coarse.search(queries[:, :ds], ivf.nprobe)
    list_sizes = np.array([len(ids) for ids in ivf.lists])
    scored = float(list_sizes[probes].sum(1).mean())
    return [
        Method(
            f"hnsw {full} (M={sizes.hnsw_m}, ef={sizes.ef_search})",
            lambda q: hnsw.search(q, K)[1],
            hnsw_mflops,
            hnsw_s,
        ),
        Method(
            f"ivf-prefix {ds}→{full} ({ivf.nlist} lists, nprobe {ivf.nprobe})",
            lambda q: ivf.search(q, K)[1],
            mflops_per_query(ivf.nlist, ds, [(round(scored), full)]),
            ivf_s,
        ),
    ]


def _chunked_top(
    scores_top: Callable[[np.ndarray], np.ndarray], queries: np.ndarray, chunk: int
) -> np.ndarray:
    return np.concatenate([scores_top(queries[lo : lo + chunk]) for lo in range(0, len(queries), chunk)])


@contextlib.contextmanager
def faiss_heap_selection(k: int) -> Iterator[None]:
    """faiss keeps the top k of a flat search in a heap (not its reservoir) inside the block: the reservoir
    is used for k ≥ ``faiss.cvar.distance_compute_min_k_reservoir`` (100 by default), restored afterwards."""
    import faiss

    before = faiss.cvar.distance_compute_min_k_reservoir
    faiss.cvar.distance_compute_min_k_reservoir = k + 1
    try:
        yield
    finally:
        faiss.cvar.distance_compute_min_k_reservoir = before


def selection_methods(database: np.ndarray, sizes: Sizes, k: int = SHORTLIST) -> list[tuple[str, Callable]]:
    """Ways to take the top ``k`` of all N scores at ``selection_dim`` (an adaptive shortlist), each a
    function of unit query prefixes [q, d] -> ids [q, k] (unordered for argpartition): faiss's flat search with its
    reservoir or its heap, numpy matmul + argpartition, torch mm + topk; and the matmul alone, the floor."""
    units = unit_rows(database[:, : sizes.selection_dim])
    index = build_index(units, "flat", use_gpu=False)
    units_t, chunk = torch.from_numpy(units), sizes.selection_chunk

    def heap(q: np.ndarray) -> np.ndarray:
        with faiss_heap_selection(k):
            return index.search(q, k)[1]

    def torch_topk(q: np.ndarray) -> np.ndarray:
        return _chunked_top(
            lambda b: torch.topk(torch.from_numpy(b) @ units_t.T, k, dim=1).indices.numpy(), q, chunk
        )

    def argpartition(q: np.ndarray) -> np.ndarray:
        return _chunked_top(lambda b: np.argpartition(-(b @ units.T), k - 1, axis=1)[:, :k], q, chunk)

    def matmul_only(q: np.ndarray) -> np.ndarray:
        for lo in range(0, len(q), chunk):
            np.matmul(q[lo : lo + chunk], units.T)  # the scores, computed and dropped
        return np.zeros((len(q), k), dtype=np.int64)

    return [
        (f"faiss IndexFlatIP.search, reservoir (k={k} ≥ 100)", lambda q: index.search(q, k)[1]),
        ("faiss IndexFlatIP.search, heap", heap),
        ("numpy matmul + argpartition", argpartition),
        ("torch mm + topk", torch_topk),
        ("numpy matmul alone (no selection: the floor)", matmul_only),
    ]


def selection_table(database: np.ndarray, queries: np.ndarray, sizes: Sizes, repeats: int) -> str:
    """Markdown: batched ms/query of each :func:`selection_methods` entry (interleaved rounds) and the share
    of each one's top-k that is in faiss's (the first entry's); the floor has no share."""
    q = unit_rows(queries[:, : sizes.selection_dim])
    methods = selection_methods(database, sizes)
    ids = [fn(q) for _, fn in methods]
    times: list[list[float]] = [[] for _ in methods]
    for _ in range(repeats):
        for i, (_, fn) in enumerate(methods):
            times[i].append(seconds(lambda fn=fn: fn(q)) / len(q))
    ref = statistics.median(times[0])
    header = (
        f"| top-{SHORTLIST} selection at D_s = {sizes.selection_dim} | batched ms/query "
        f"| vs faiss reservoir | same top {SHORTLIST} as faiss (%) |"
    )
    lines = [header, "|---|---:|---:|---:|"]
    for (name, _), got, t in zip(methods, ids, times, strict=False):
        same = "—" if "floor" in name else f"{exact_recall(got, ids[0]):.1f}"
        lines.append(f"| {name} | {ms_spread(t, '{:.3g}')} | {statistics.median(t) / ref:.2f}× | {same} |")
    return "\n".join(lines)


def exact_recall(ids: np.ndarray, exact: np.ndarray) -> float:
    """Mean over queries of |ids row ∩ exact row| / k, in %."""
    k = exact.shape[1]
    return (
        100.0 * float(np.mean([len(np.intersect1d(a[:k], b)) for a, b in zip(ids, exact, strict=False)])) / k
    )


def _one_at_a_time(search: Callable[[np.ndarray], np.ndarray], queries: np.ndarray) -> None:
    for i in range(len(queries)):
        search(queries[i : i + 1])


def measure(methods: list[Method], queries: np.ndarray, targets: np.ndarray, sizes: Sizes, repeats: int):
    """Quality pass, then ``repeats`` interleaved timing rounds: rows of dicts (first method = reference)."""
    results = [m.search(queries) for m in methods]  # quality pass (and warm-up)
    single = queries[: sizes.single]
    batched: list[list[float]] = [[] for _ in methods]
    one: list[list[float]] = [[] for _ in methods]
    for _ in range(repeats):
        for i, m in enumerate(methods):
            block = queries[: m.batch_cap]
            batched[i].append(seconds(lambda m=m, b=block: m.search(b)) / len(block))
            one[i].append(seconds(lambda m=m: _one_at_a_time(m.search, single)) / len(single))
    rows = []
    for m, ids, b, o in zip(methods, results, batched, one, strict=False):
        rows.append(
            {
                "name": m.name,
                "mflops": m.mflops,
                "build_s": m.build_s,
                "batched": b,
                "one": o,
                "exact_r10": exact_recall(ids, results[0]),
                "task_r10": 100.0 * float((ids[:, :K] == targets[:, None]).any(1).mean()),
            }
        )
    return rows


def format_rows(rows: list[dict]) -> tuple[str, str]:
    """The markdown table and the verdict line on the target."""
    ref = rows[0]
    ref_b, ref_o = statistics.median(ref["batched"]), statistics.median(ref["one"])
    header = (
        "| method | MFLOPs/query | MFLOPs ratio | batched ms/query | batched speedup | one-at-a-time ms/query "
        "| one-at-a-time speedup | exact R@10 (%) | lost (pt) | task R@10 (%) | build (s) |"
    )
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    verdicts = []
    for row in rows:
        sb, so = ref_b / statistics.median(row["batched"]), ref_o / statistics.median(row["one"])
        lost = 100.0 - row["exact_r10"]
        lines.append(
            f"| {row['name']} | {row['mflops']:.3g} | {ref['mflops'] / row['mflops']:.3g}× | "
            f"{ms_spread(row['batched'], '{:.3g}')} | {sb:.3g}× | {ms_spread(row['one'], '{:.3g}')} | {so:.3g}× | "
            f"{row['exact_r10']:.1f} | {lost:.1f} | {row['task_r10']:.1f} | {row['build_s']:.1f} |"
        )
        if row["name"].startswith(("adaptive", "funnel")):
            held = sb >= TARGET_SPEEDUP and so >= TARGET_SPEEDUP and lost <= TARGET_LOST
            verdicts.append(
                f"{row['name']}: {'held' if held else 'missed'} "
                f"({sb:.3g}× batched, {so:.3g}× one at a time, {lost:.1f} pt lost)"
            )
    verdict = (
        f"Target (adaptive or funnel ≥ {TARGET_SPEEDUP:.0f}× faster than flat, batched and one at a time, with ≤ "
        f"{TARGET_LOST} pt of exact R@10 lost): " + "; ".join(verdicts) + "."
    )
    return "\n".join(lines), verdict


@register_benchmark("retrieval", order=8)
def retrieval(*, smoke: bool, repeats: int) -> str:
    """Trained nested model, N×D database: flat D vs adaptive, funnel, HNSW and prefix-IVF (time, recall)."""
    sizes = SMOKE if smoke else FULL
    planted = Planted()
    with threads(THREADS):
        (encoder, loss), train_s = _built(lambda: train_encoder(sizes, planted))
        database, queries, targets = embed_data(sizes, planted, encoder)
        methods = (
            cascade_methods(database, sizes)
            + ivf_cascade_methods(database, queries, sizes)
            + ann_methods(database, queries, sizes)
        )
        rows = measure(methods, queries, targets, sizes, repeats)
        selection = selection_table(database, queries, sizes, repeats)
    table, verdict = format_rows(rows)
    return (
        f"N = {sizes.database:,} database vectors, D = {sizes.dim}, from an MLP encoder trained in-process "
        f"for {sizes.steps} steps ({train_s:.0f} s, last nested SH loss {loss:.4f}) with nesting "
        f"{list(sizes.nesting)} on the planted generator (raydist/benchmarks/retrieval.py: what is measured); "
        f"Q = {sizes.queries} queries (noisy views of database items), k = {K}, shortlist {SHORTLIST}, "
        f"{THREADS} faiss/torch thread. ms/query as median (min–max) of {repeats} interleaved rounds after a "
        f"warm-up; batched: all Q in one call; one at a time: the first {sizes.single} queries. Speedup and "
        f"MFLOPs ratio are against the flat {sizes.dim} row of the same run; exact R@10 = overlap with flat "
        f"{sizes.dim}'s top 10 (lost = 100 − it); task R@10 = the query's own item in the top 10.\n\n"
        f"{verdict}\n\n{table}\n\nThe flat shortlist's k-selection, all Q queries in one call, {repeats} "
        f"interleaved rounds of its own (selection_table: what is measured):\n\n{selection}"
    )
