"""Benchmark of ``raydist serve`` ("serve", issue #37): requests/s and latency of /search through Ray Serve from 8
concurrent clients on loopback, flat vs adaptive vs funnel search, against the Embedder + FAISS called in process.

What is measured (full mode; smoke mode is the same at tiny sizes, :data:`SMOKE`):

1. **Model and index.** The ``default`` preset's pairs model (GRU text encoder, 256-d joint space) nested at 32,
   64 and 128 dims, freshly initialised with a fixed seed (serving costs do not depend on the weights) and saved
   as a checkpoint; its vocabulary is that of a synthetic dataset of 200 images. The database: N = 100,000 random
   feature vectors embedded by the model's image side, written as flat indexes at 32, 64, 128 and 256 dims by
   :func:`raydist.retrieval.index.build_indexes` (what ``raydist index`` writes). Queries: the dataset's captions.
2. **Server.** :func:`raydist.serving.deployment.deploy` with that index folder: one replica of 0.5 logical CPU,
   ``@serve.batch`` up to 16 requests waiting at most 5 ms, on 127.0.0.1. Each request is one caption,
   ``{"texts": [q], "k": 10, "mode": M}`` at the full dim; adaptive shortlists 200 rows at 32 dims and re-ranks
   at 256; funnel re-ranks 32→64→128→256 keeping 200, 100, 50 (:func:`raydist.retrieval.search.default_funnel`).
3. **Clients.** 8 threads, each with one keep-alive HTTP connection, send their share of the requests one
   after another; requests/s = requests / wall time from the first send to the last answer; p50 / p99 of
   the per-request latencies, pooled over the rounds. 16 requests warm the server up first.
4. **The floor.** The same queries answered in this process by the Embedder and the same indexes
   (:meth:`raydist.serving.service.Retriever.search`), one caller, one query per call, no HTTP, with one
   torch and faiss thread (a replica with under one CPU gets one); requests/s = calls / wall time.
5. ``repeats`` rounds, every mode interleaved in each round; requests/s as median (min–max) over the rounds.
6. **HTTP and Serve alone.** ``GET /health`` sent the same way: the proxy and the replica, no model, no search.
7. **Batching off.** The server deployed again with ``max_batch=1`` (each request answered alone) and flat
   search measured the same way, against the same floor (full mode only).
"""

from __future__ import annotations

import http.client
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from raydist.benchmarks.catalog import register_benchmark
from raydist.benchmarks.harness import ray_instance, row, spread
from raydist.benchmarks.retrieval import threads
from raydist.checkpoint import save_checkpoint
from raydist.config import load_config
from raydist.data import make_synthetic
from raydist.data.tokenizer import train_captions
from raydist.retrieval.embedder import Embedder
from raydist.retrieval.index import build_indexes
from raydist.retrieval.search import MODES
from raydist.retrieval.sets import RetrievalSet
from raydist.serving.service import ServeOptions, load_retriever
from raydist.tasks import DataInfo, build_task

FULL = {"database": 100_000, "requests": 800, "clients": 8}
SMOKE = {"database": 2_000, "requests": 32, "clients": 8}
NESTING = [32, 64, 128]
K = 10
WARMUP = 16
HEALTH = "GET /health"  # the same path through Serve with no model and no search: HTTP and Serve alone


def _fresh_checkpoint(folder: Path, data_dir: Path) -> Path:
    """A checkpoint of the default preset's pairs model nested at :data:`NESTING`, seeded, untrained."""
    cfg = load_config("default", overrides={"data.path": str(data_dir), "model.nesting": NESTING})
    info = DataInfo.from_dataset(data_dir)
    torch.manual_seed(0)
    model = build_task(cfg, info).build_model()
    return save_checkpoint(folder, {"model": model.state_dict()}, cfg, task=info.to_json(), files=info.files)


def _write_index(checkpoint: Path, out: Path, n: int) -> None:
    """Flat indexes over ``n`` random feature vectors embedded by the checkpoint's image side."""
    embedder = Embedder.from_checkpoint(checkpoint)
    features = np.random.default_rng(0).standard_normal((n, embedder.trained.data_info.feature_dim))
    z = np.concatenate([embedder.embed_features(features[s : s + 8192]) for s in range(0, n, 8192)])
    ids = np.arange(n)
    rset = RetrievalSet(
        "pairs", "t2i", z, z[:1], ids, ids[:1], ids, ids[:1], two_way=True, source=str(checkpoint)
    )
    build_indexes(rset, [*NESTING, embedder.trained.config.model.embed_dim], "flat", out)


def _clients(port: int, bodies: Sequence[bytes | None], clients: int) -> tuple[float, list[float]]:
    """Send ``bodies`` to /search (None: a GET of /health) from ``clients`` threads (one keep-alive connection
    each, an equal share of the bodies each, one after another): (wall seconds, per-request latencies)."""
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(share: Sequence[bytes]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        mine = []
        for body in share:
            start = time.perf_counter()
            if body is None:
                conn.request("GET", "/health")
            else:
                conn.request("POST", "/search", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            payload = response.read()
            mine.append(time.perf_counter() - start)
            if response.status != 200:
                errors.append(f"{response.status} {payload[:200]!r}")
        conn.close()
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=client, args=(bodies[i::clients],)) for i in range(clients)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"serve benchmark: {len(errors)} requests failed, e.g. {errors[0]}")
    return wall, latencies


def _in_process(retriever, queries: Sequence[str], mode: str) -> tuple[float, list[float]]:
    """The floor: each query embedded and searched in this process, one call after another."""
    latencies = []
    start = time.perf_counter()
    for q in queries:
        t = time.perf_counter()
        z = retriever.embedder.embed_texts([q])
        retriever.search(z, k=K, dim=retriever.full_dim, mode=mode)
        latencies.append(time.perf_counter() - t)
    return time.perf_counter() - start, latencies


def _ms(latencies: list[float], q: float) -> str:
    return f"{1e3 * float(np.quantile(latencies, q)):.1f}"


def _serve_rounds(
    port: int,
    retriever,
    queries: Sequence[str],
    modes: Sequence[str],
    repeats: int,
    clients: int,
    floor: bool,
) -> dict[str, dict[str, list[float]]]:
    """Per mode: the server's requests/s per round and latencies; with ``floor`` the in-process ones too. Every
    mode runs once per round, in turn."""
    out = {m: {"serve": [], "serve_lat": [], "floor": [], "floor_lat": []} for m in modes}
    warm = [json.dumps({"texts": [q], "k": K}).encode() for q in queries[:WARMUP]]
    _clients(port, warm, clients)
    for _ in range(repeats):
        for mode in modes:
            if mode == HEALTH:
                bodies: list[bytes | None] = [None] * len(queries)
            else:
                bodies = [json.dumps({"texts": [q], "k": K, "mode": mode}).encode() for q in queries]
            wall, times = _clients(port, bodies, clients)
            out[mode]["serve"].append(len(bodies) / wall)
            out[mode]["serve_lat"] += times
            if floor and mode != HEALTH:
                with threads(1):
                    wall, times = _in_process(retriever, queries, mode)
                out[mode]["floor"].append(len(queries) / wall)
                out[mode]["floor_lat"] += times
    return out


@register_benchmark("serve", order=15, ray=True)
def serve_rate(*, smoke: bool, repeats: int) -> str:
    """Requests/s, p50/p99 of `raydist serve` /search (8 clients, loopback): flat, adaptive, funnel; in process.

    Each search mode through Ray Serve against the Embedder + FAISS called in this process (the floor); then flat
    search again with batching off (``--max-batch 1``; not in smoke mode)."""
    from raydist.distributed.spawn import free_port
    from raydist.serving.deployment import deploy, stop

    sizes = SMOKE if smoke else FULL
    with tempfile.TemporaryDirectory() as tmp, ray_instance():
        root = Path(tmp)
        data = make_synthetic(root / "data", images=200, captions_per_image=5, seed=0)
        checkpoint = _fresh_checkpoint(root / "run" / "checkpoint_00000001", data)
        index = str(root / "index")
        _write_index(checkpoint, root / "index", sizes["database"])
        captions = list(train_captions(data))
        queries = [captions[i % len(captions)] for i in range(sizes["requests"])]
        retriever = load_retriever(checkpoint, index, options=ServeOptions())
        batching = [ServeOptions()] if smoke else [ServeOptions(), ServeOptions(max_batch=1)]
        results = {}
        for options in batching:
            port = free_port()
            served = deploy(checkpoint, index=index, port=port, replica_cpus=0.5, options=options)
            try:
                batched = options.max_batch > 1
                modes = (*MODES, HEALTH) if batched else ("flat",)
                rounds = _serve_rounds(port, retriever, queries, modes, repeats, sizes["clients"], batched)
            finally:
                stop(served)
            for mode, measured in rounds.items():
                results[mode if batched else f"{mode}, batching off"] = measured
    what = (
        f"{sizes['requests']} requests per mode and round (one caption each, k = {K}, full dim 256), "
        f"{sizes['clients']} concurrent clients on 127.0.0.1, database N = {sizes['database']:,}; "
        f"{repeats} round(s). Requests/s as median (min–max) over rounds; latencies pooled. Batching: up to "
        f"{ServeOptions().max_batch} requests, {1e3 * ServeOptions().batch_wait_s:g} ms wait."
    )
    lines = [
        what,
        "",
        row(
            "search",
            "serve req/s",
            "serve p50 ms",
            "serve p99 ms",
            "in-process req/s",
            "in-process p50 ms",
            "in-process p99 ms",
            "serve / in-process",
        ),
        "|" + "---|" * 8,
    ]
    floor = results["flat"]
    for label, m in results.items():
        served = [label, spread(m["serve"]), _ms(m["serve_lat"], 0.5), _ms(m["serve_lat"], 0.99)]
        if label == HEALTH:
            lines.append(row(*served, "—", "—", "—", "—"))
            continue
        base = m if m["floor"] else floor  # batching off: against flat search's floor
        ratio = statistics.median(m["serve"]) / statistics.median(base["floor"])
        floor_cells = [spread(base["floor"]), _ms(base["floor_lat"], 0.5), _ms(base["floor_lat"], 0.99)]
        lines.append(row(*served, *floor_cells, f"{ratio:.2f}×"))
    return "\n".join(lines)
