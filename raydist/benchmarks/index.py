"""Benchmark of corpus indexing ("index"): database rows/s that ``raydist index --num-workers`` embeds with 1 and
2 Ray Data actors, against one process embedding the same shards without Ray; and the FAISS index build time
and bytes against the number of vectors N (10k, 100k, 1M synthetic unit vectors; HNSW up to 100k)."""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from raydist.benchmarks.catalog import register_benchmark
from raydist.benchmarks.harness import median, row, spread
from raydist.checkpoint import save_checkpoint
from raydist.config import load_config
from raydist.data.synthetic_labels import make_synthetic_labels
from raydist.retrieval.budget import format_size
from raydist.retrieval.corpus import dataset_shards, embed_corpus, shard_vectors
from raydist.retrieval.index import unit_rows
from raydist.retrieval.trained import load_trained
from raydist.tasks import DataInfo, build_task

# (classes, train rows a class, feature dim, rows per shard) of the embedded labelled dataset (every row a vector)
FULL_DATA, SMOKE_DATA = (50, 1600, 256, 10_000), (4, 40, 16, 60)
FULL_SIZES, SMOKE_SIZES = (10_000, 100_000, 1_000_000), (2_000,)
HNSW_MAX = 100_000  # HNSW builds above this take minutes on 2 cores
DIM = 64
CPUS_PER_ACTOR = 0.5


def _checkpoint(root: Path, data: Path) -> Path:
    """An untrained ``tiny`` model of the dataset: embedding cost does not depend on training."""
    cfg = load_config("tiny", overrides={"data.path": str(data), "train.num_workers": 0})
    info = DataInfo.from_dataset(data)
    torch.manual_seed(0)
    model = build_task(cfg, info).build_model()
    folder = root / "run" / "checkpoint_00000001"
    return save_checkpoint(folder, {"model": model.state_dict()}, cfg, task=info.to_json(), files=info.files)


def _one_process(checkpoint: Path, data: Path) -> tuple[float, int]:
    """Seconds and rows of the same shards embedded in this process (the model loaded once, as an actor does)."""
    trained = load_trained(checkpoint, need_data=False)
    shards, _ = dataset_shards(str(data), "all")
    start = time.perf_counter()
    for shard in shards:
        shard_vectors(trained, pq.read_table(data / shard.file))
    return time.perf_counter() - start, sum(s.rows for s in shards)


def embedding_rates(root: Path, smoke: bool, repeats: int) -> list[str]:
    """Rows: one process, then 1 and 2 actors (each run into a fresh folder: every shard embedded)."""
    classes, per_class, dim, per_shard = SMOKE_DATA if smoke else FULL_DATA
    data = make_synthetic_labels(
        root / "data", classes=classes, train_per_class=per_class, val_per_class=per_class // 8,
        test_per_class=per_class // 8, dim=dim, seed=0, rows_per_shard=per_shard,
    )  # fmt: skip
    checkpoint = _checkpoint(root, data)
    rates: dict[str, list[float]] = {"one process, no Ray": []}
    rows = 0
    for r in range(repeats):
        seconds, rows = _one_process(checkpoint, data)
        rates["one process, no Ray"].append(rows / seconds)
        for workers in (1, 2):
            start = time.perf_counter()
            embed_corpus(checkpoint, str(root / f"out-{workers}-{r}"), split="all", num_workers=workers,
                         cpus_per_worker=CPUS_PER_ACTOR)  # fmt: skip
            rates.setdefault(f"{workers} Ray Data actor{'s' if workers > 1 else ''}", []).append(
                rows / (time.perf_counter() - start)
            )
    base = median(rates["one process, no Ray"])
    shards = len(dataset_shards(str(data), "all")[0])
    lines = [
        f"Embedding every split of a synthetic labelled dataset: {rows:,} rows of {dim}-d features ({classes} "
        f"classes) in {shards} shards of up to {per_shard:,} rows, each row a vector, by an untrained `tiny` "
        "labels model; the actors' start and the Ray Data plan are included:",
        "",
        "| embedded by | rows/s | vs one process |",
        "|---|---:|---:|",
    ]
    lines += [row(name, spread(r, "{:,.0f}"), f"{median(r) / base:.2f}×") for name, r in rates.items()]
    return lines


def build_costs(smoke: bool) -> list[str]:
    """Build seconds and serialized bytes of flat, HNSW32, IVF and IVF-PQ indexes over N unit vectors."""
    import faiss

    lines = [
        "",
        f"FAISS index builds over N synthetic unit vectors of {DIM} dims (IVF: √N lists trained on 64 rows a "
        "list; train + add, one build each):",
        "",
        "| N | index | build s | bytes | bytes / vector |",
        "|---:|---|---:|---:|---:|",
    ]
    rng = np.random.default_rng(0)
    for n in SMOKE_SIZES if smoke else FULL_SIZES:
        x = unit_rows(rng.standard_normal((n, DIM), dtype=np.float32))
        nlist = max(1, min(round(math.sqrt(n)), n // 39))
        bits = 8 if n >= 39 * 256 else 4  # k-means wants 39 rows a centroid
        factories = ["Flat", f"IVF{nlist},Flat", f"IVF{nlist},PQ{DIM // 8}x{bits}"]
        if n <= HNSW_MAX:
            factories.insert(1, "HNSW32,Flat")
        for factory in factories:
            index = faiss.index_factory(DIM, factory, faiss.METRIC_INNER_PRODUCT)
            ivf = faiss.try_extract_index_ivf(index)
            if ivf is not None and "PQ" in factory:
                faiss.downcast_index(ivf).do_polysemous_training = False
            start = time.perf_counter()
            train = x[rng.choice(n, min(n, 64 * nlist), replace=False)] if ivf is not None else x
            index.train(train)
            index.add(x)
            built = time.perf_counter() - start
            size = len(faiss.serialize_index(index))
            lines.append(row(f"{n:,}", factory, f"{built:.2f}", format_size(size), f"{size / n:.1f}"))
    return lines


@register_benchmark("index", order=17, ray=True)
def index_benchmark(*, smoke: bool, repeats: int) -> str:
    """Corpus indexing: rows/s embedded by 1 vs 2 Ray Data actors (and one process), index build time and bytes vs N."""
    with tempfile.TemporaryDirectory(prefix="raydist-bench-index-") as tmp:
        lines = embedding_rates(Path(tmp), smoke, 1 if smoke else repeats)
    return "\n".join([*lines, *build_costs(smoke)])
