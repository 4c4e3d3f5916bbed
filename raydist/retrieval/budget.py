"""An index chosen under a memory budget and a recall floor: the Matryoshka prefix dim, the faiss index type
(flat, HNSW, IVF, IVF-PQ, OPQ + IVF-PQ) and its search parameter (nprobe, efSearch) chosen together, with the
chosen index's bytes, recall@10 and queries/s measured (``raydist index --memory-budget SIZE --min-recall R``)."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from raydist.retrieval.index import DATABASE_IDS, INDEX_META, unit_rows
from raydist.retrieval.sets import RetrievalSet

K = 10  # recall@K of exact search
HELD_OUT_QUERIES = 500  # at most this many database rows serve as held-out queries
MIN_POINTS_PER_CENTROID = 39  # faiss's own floor for k-means training (fewer: a warning, then poor centroids)
HNSW_EF = (16, 32, 64, 128)
UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}


def parse_size(text: str) -> int:
    """Bytes of ``64KB``, ``2GB``, ``1.5MB``, ``4096`` (units of 1024: KB = 1024 bytes)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?B)?\s*", text.upper())
    if not match:
        raise ValueError(f"--memory-budget {text}: expected a size such as 64KB, 512MB or 2GB")
    return int(float(match.group(1)) * UNITS[match.group(2) or "B"])


def format_size(n: float) -> str:
    """``n`` bytes in the largest unit of 1024 that keeps it ≥ 1 (``62.5 KB``)."""
    for unit in ("TB", "GB", "MB", "KB"):
        if n >= UNITS[unit]:
            return f"{n / UNITS[unit]:.1f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class Structure:
    """One index to build: a prefix ``dim``, a faiss ``index_factory`` string, and the search parameter it
    sweeps (``nprobe`` / ``efSearch``, None for flat) with its values, cheapest first."""

    dim: int
    factory: str
    param: str | None = None
    values: tuple[int, ...] = (0,)
    nlist: int = 0
    pq_m: int = 0
    pq_bits: int = 0

    def work(self, value: int, n: int) -> float:
        """Multiply-adds per query, estimated: flat N·d; HNSW efSearch·M·d; IVF nlist·d + nprobe·(N/nlist)·d
        (IVF-PQ: a table of 2^bits·d, then m per code scanned; OPQ: + d² for the rotation)."""
        d = self.dim
        if self.factory.startswith("HNSW"):
            return value * int(self.factory[4:].split(",")[0]) * d
        if self.nlist:
            scanned = value * n / self.nlist
            per_code = self.pq_m if self.pq_m else d
            extra = (2**self.pq_bits) * d if self.pq_m else 0
            return (
                self.nlist * d + extra + scanned * per_code + (d * d if self.factory.startswith("OPQ") else 0)
            )
        return n * d


@dataclass(frozen=True)
class Measured:
    """One (structure, parameter value): the index's serialized bytes and its recall@10 of exact search."""

    dim: int
    factory: str
    param: str | None
    value: int
    bytes: int
    recall_at_10: float
    work: float

    def describe(self) -> str:
        setting = f" {self.param}={self.value}" if self.param else ""
        return f"{self.factory} at d={self.dim}{setting} ({format_size(self.bytes)}, recall@10 {self.recall_at_10:.3f})"


@dataclass
class Choice:
    """The chosen index (built over every row), what was measured to choose it and its queries/s."""

    best: Measured
    index: Any
    measured: list[Measured] = field(default_factory=list)
    queries_per_s: float = 0.0
    held_out: int = 0

    def record(self, budget: int, min_recall: float) -> dict[str, Any]:
        """What ``indexes.json`` records of it."""
        return {
            "bytes": self.best.bytes,
            "recall_at_10": self.best.recall_at_10,
            "queries_per_s": self.queries_per_s,
            "budget": {
                "memory_budget": budget,
                "min_recall": min_recall,
                "dim": self.best.dim,
                "index": self.best.factory,
                **({self.best.param: self.best.value} if self.best.param else {}),
                "held_out_queries": self.held_out,
                "candidates_measured": len(self.measured),
            },
        }


def candidate_structures(n: int, dims: Sequence[int]) -> list[Structure]:
    """The candidate set at each prefix dim: flat; HNSW (M 16, 32; efSearch 16–128); IVF-flat and IVF-PQ
    (nlist ≈ √N with ≥ 39 rows a list; nprobe 1, 2, 4, … nlist; PQ with m = d/2, d/4, d/8 sub-quantizers of 8 bits
    when N ≥ 39·256, else 4 bits when N ≥ 39·16); OPQ + IVF-PQ when 8-bit PQ is trained."""
    out: list[Structure] = []
    nlist = max(1, min(round(math.sqrt(n)), n // MIN_POINTS_PER_CENTROID))
    probes = tuple(sorted({min(2**i, nlist) for i in range(int(math.log2(nlist)) + 2)}))
    bits = 8 if n >= MIN_POINTS_PER_CENTROID * 256 else 4 if n >= MIN_POINTS_PER_CENTROID * 16 else 0
    for d in sorted(set(dims)):
        out.append(Structure(d, "Flat"))
        out += [Structure(d, f"HNSW{m},Flat", "efSearch", HNSW_EF) for m in (16, 32)]
        if nlist > 1:
            out.append(Structure(d, f"IVF{nlist},Flat", "nprobe", probes, nlist))
        for m in sorted({d // 2, d // 4, d // 8} - {0}) if bits else ():
            if d % m:
                continue
            ivfpq = f"IVF{nlist},PQ{m}x{bits}"
            out.append(Structure(d, ivfpq, "nprobe", probes, nlist, m, bits))
            if bits == 8:
                out.append(Structure(d, f"OPQ{m},{ivfpq}", "nprobe", probes, nlist, m, bits))
    return out


class Bench:
    """The vectors, the held-out queries and their exact top-10 (flat search at the full dim, each query's
    own row left out of every answer), and the indexes built so far."""

    def __init__(self, vectors: np.ndarray, *, seed: int = 0) -> None:
        import faiss

        self.vectors = unit_rows(vectors)
        n = len(self.vectors)
        if n < 2:
            raise ValueError("an index under a budget needs at least 2 vectors")
        q = min(HELD_OUT_QUERIES, max(1, n // 10))
        self.query_rows = np.sort(np.random.default_rng(seed).choice(n, q, replace=False))
        self.k = min(K, n - 1)
        exact = faiss.IndexFlatIP(self.vectors.shape[1])
        exact.add(self.vectors)
        self.exact = self._answers(exact, self.vectors.shape[1])
        self._built: dict[Structure, tuple[Any, int]] = {}

    def _answers(self, index: Any, dim: int) -> np.ndarray:
        """Each query's top k rows, its own row left out."""
        _, rows = index.search(unit_rows(self.vectors[self.query_rows, :dim]), self.k + 1)
        return np.array(
            [[r for r in row if r != own][: self.k] for row, own in zip(rows, self.query_rows, strict=True)]
        )

    def build(self, s: Structure) -> tuple[Any, int]:
        """The index of ``s`` over every row (built once) and its serialized bytes."""
        import faiss

        if s not in self._built:
            index = faiss.index_factory(s.dim, s.factory, faiss.METRIC_INNER_PRODUCT)
            ivf = faiss.try_extract_index_ivf(index)
            if (
                ivf is not None and s.pq_m
            ):  # no polysemous code ordering: it costs seconds, search never uses it
                faiss.downcast_index(ivf).do_polysemous_training = False
            x = unit_rows(self.vectors[:, : s.dim])
            threads = faiss.omp_get_max_threads()
            faiss.omp_set_num_threads(
                1
            )  # HNSW's parallel inserts build another graph each time: not comparable
            try:
                index.train(x)
                index.add(x)
            finally:
                faiss.omp_set_num_threads(threads)
            self._built[s] = (index, len(faiss.serialize_index(index)))
        return self._built[s]

    def measure(self, s: Structure, value: int) -> Measured:
        """Recall@10 of exact search of ``s`` searched with ``value``: the mean share of each held-out query's
        exact top 10 that it returns in its top 10."""
        import faiss

        index, size = self.build(s)
        if s.param:
            faiss.ParameterSpace().set_index_parameter(index, s.param, value)
        got = self._answers(index, s.dim)
        hits = [len(set(g[g >= 0]) & set(e)) for g, e in zip(got, self.exact, strict=True)]
        recall = float(np.mean(hits)) / self.k
        return Measured(s.dim, s.factory, s.param, value, size, recall, s.work(value, len(self.vectors)))


def _rank(m: Measured) -> tuple:
    """The order among indexes meeting both limits: least work per query, then fewest bytes, then names."""
    return (m.work, m.bytes, m.dim, m.factory, m.value)


def enumerate_candidates(bench: Bench, structures: Sequence[Structure]) -> list[Measured]:
    """Every (structure, value) measured: the brute force the chooser must agree with."""
    return [bench.measure(s, v) for s in structures for v in s.values]


def choose_index(
    vectors: np.ndarray,
    dims: Sequence[int],
    memory_budget: int,
    min_recall: float,
    *,
    seed: int = 0,
    progress: Callable[[str], None] = lambda line: None,
) -> Choice:
    """The index of ``vectors`` [N, D] (unit rows; prefixes re-normalised) at one of ``dims`` whose serialized
    bytes are ≤ ``memory_budget`` and whose recall@10 of exact search is ≥ ``min_recall``, with the least
    estimated work per query (:meth:`Structure.work`; ties: fewer bytes). A structure over the budget is not
    searched; a structure's parameter sweep stops at the first value that reaches ``min_recall`` (a larger one
    only costs more). Refused (ValueError, one line) for a recall outside (0, 1], a budget below the smallest
    candidate, or when no candidate meets both -- naming the best within the budget and the smallest that
    reaches the recall."""
    if not 0 < min_recall <= 1:
        raise ValueError(f"--min-recall {min_recall}: expected 0 < R <= 1 (recall@10 of exact search)")
    bench = Bench(vectors, seed=seed)
    structures = candidate_structures(len(bench.vectors), dims)
    sizes = {s: bench.build(s)[1] for s in structures}
    smallest = min(structures, key=lambda s: sizes[s])
    if sizes[smallest] > memory_budget:
        raise ValueError(
            f"--memory-budget {format_size(memory_budget)} is below the smallest candidate index "
            f"({smallest.factory} at d={smallest.dim}: {format_size(sizes[smallest])})"
        )
    measured: list[Measured] = []
    for s in structures:
        if sizes[s] > memory_budget:
            continue
        for value in s.values:
            measured.append(bench.measure(s, value))
            if measured[-1].recall_at_10 >= min_recall:
                break
    feasible = [m for m in measured if m.recall_at_10 >= min_recall]
    if not feasible:
        within = max(measured, key=lambda m: (m.recall_at_10, -m.bytes))
        over = [bench.measure(s, v) for s in structures if sizes[s] > memory_budget for v in s.values]
        reaching = [m for m in over if m.recall_at_10 >= min_recall]
        smallest_reaching = (
            f"the smallest reaching it: {min(reaching, key=lambda m: m.bytes).describe()}"
            if reaching
            else "no candidate reaches it at any size"
        )
        raise ValueError(
            f"no index within {format_size(memory_budget)} reaches recall@10 {min_recall}: the best within the "
            f"budget is {within.describe()}; {smallest_reaching}"
        )
    best = min(feasible, key=_rank)
    structure = next(s for s in structures if (s.dim, s.factory) == (best.dim, best.factory))
    index = bench.build(structure)[0]
    if best.param:
        import faiss

        faiss.ParameterSpace().set_index_parameter(index, best.param, best.value)
    progress(f"chose {best.describe()} of {len(measured)} measured")
    return Choice(best, index, measured, _queries_per_s(index, bench, best.dim), len(bench.query_rows))


def _queries_per_s(index: Any, bench: Bench, dim: int) -> float:
    """Held-out queries searched one at a time per second (top 10)."""
    queries = unit_rows(bench.vectors[bench.query_rows, :dim])
    start = time.perf_counter()
    for q in queries:
        index.search(q[None, :], bench.k)
    return len(queries) / max(time.perf_counter() - start, 1e-9)


def measured_table(measured: Sequence[Measured]) -> list[dict[str, Any]]:
    """Measured candidates as JSON rows."""
    return [asdict(m) for m in measured]


@dataclass(frozen=True)
class IndexBudget:
    """``--memory-budget`` (bytes of the serialized index) and ``--min-recall`` (recall@10 of exact search)."""

    memory_budget: int
    min_recall: float


def write_budget_index(
    rset: RetrievalSet,
    dims: Sequence[int],
    budget: IndexBudget,
    out_dir: str | Path,
    progress: Callable[[str], None] = lambda line: None,
) -> Choice:
    """:func:`choose_index` over ``rset.database`` at ``dims``, written as an index folder (the chosen prefix dim's
    ``index_d{dim}.faiss``, ``database_ids.npy``, ``indexes.json`` with the index's ``bytes``,
    ``recall_at_10``, ``queries_per_s`` and the choice's limits); ``raydist search`` and ``raydist serve`` read
    it as any index folder (its search parameter is stored in the faiss file)."""
    import faiss

    choice = choose_index(rset.database, dims, budget.memory_budget, budget.min_recall, progress=progress)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dim = choice.best.dim
    name = f"index_d{dim}.faiss"
    faiss.write_index(choice.index, str(out / name))
    np.save(out / DATABASE_IDS, rset.database_ids)
    meta = {
        "kind": choice.best.factory,
        "dims": [dim],
        "files": {str(dim): name},
        "checkpoint": rset.source,
        "split": rset.split,
        "task": rset.task,
        "direction": rset.direction,
        "num_database": len(rset.database),
        "index_options": {choice.best.param: choice.best.value} if choice.best.param else {},
        **choice.record(budget.memory_budget, budget.min_recall),
    }
    (out / INDEX_META).write_text(json.dumps(meta, indent=1))
    return choice
