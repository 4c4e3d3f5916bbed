"""Benchmark of ``raydist serve`` ("serve", issues #37 and #50): requests/s and latency of /search through Ray Serve
from 1 and 8 concurrent clients on loopback, flat vs adaptive vs funnel search, against the Embedder + FAISS called
in process, and where a request's time goes.

What is measured (full mode; smoke mode is the same at tiny sizes, :data:`SMOKE`):

1. **Model and index.** The ``default`` preset's pairs model (GRU text encoder, 256-d joint space) nested at 32,
   64 and 128 dims, freshly initialised with a fixed seed (serving costs do not depend on the weights) and saved
   as a checkpoint; its vocabulary is that of a synthetic dataset of 200 images. The database: N = 100,000 random
   feature vectors embedded by the model's image side, written as flat indexes at 32, 64, 128 and 256 dims by
   :func:`raydist.retrieval.index.build_indexes` (what ``raydist index`` writes). Queries: the dataset's captions.
2. **Server.** :func:`raydist.serving.deployment.deploy` with that index folder: one replica of 0.5 logical CPU,
   the default :class:`raydist.serving.service.ServeOptions` (the requests waiting answered together, up to 16,
   no fixed wait), on 127.0.0.1. Each request is one caption, ``{"texts": [q], "k": 10, "mode": M}`` at the full
   dim; adaptive shortlists 200 rows at 32 dims and re-ranks at 256; funnel re-ranks 32→64→128→256 keeping 200,
   100, 50 (:func:`raydist.retrieval.search.default_funnel`).
3. **Clients.** 1 and 8 threads (:data:`CLIENTS`), each with one keep-alive HTTP connection, send their share of
   the requests one after another (a quarter of them at 1 client); requests/s = requests / wall time from the
   first send to the last answer; p50 / p99 of the per-request latencies, pooled over the rounds; the clients'
   own CPU per request (this process's CPU time while they run: they must not be what limits the rate). 16
   requests warm the server up first.
4. **The floor.** The same queries answered in this process by the Embedder and the same indexes
   (:meth:`raydist.serving.service.Retriever.search`), one caller, one query per call, no HTTP, with one
   torch and faiss thread (a replica with under one CPU gets one); requests/s = calls / wall time.
5. ``repeats`` rounds, every mode and client count interleaved in each round; requests/s as median (min–max)
   over the rounds.
6. **HTTP and Serve alone.** ``GET /health`` sent the same way: the proxy and the replica, no model, no search.
7. **Where the time goes.** Each answer's ``Server-Timing`` header (the replica's own clock): parsing the body,
   queueing for its batch, the batch's embedding and search, JSON encoding, the replica in all; the client's
   latency minus the replica's is HTTP, Serve's proxy and the hop to the replica. Means over the rounds.
8. **Batching off.** The server deployed again with ``max_batch=1`` (each request answered alone) and flat
   search measured the same way at 8 clients, against the same floor (full mode only).
"""

from __future__ import annotations

import http.client
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
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

FULL = {"database": 100_000, "requests": 800}
SMOKE = {"database": 2_000, "requests": 32}
CLIENTS = (1, 8)  # concurrent clients; at 1 client a quarter of the requests
NESTING = [32, 64, 128]
K = 10
WARMUP = 16
HEALTH = "GET /health"  # the same path through Serve with no model and no search: HTTP and Serve alone
STAGES = ("parse", "queue", "embed", "search", "encode", "replica")  # the replica's Server-Timing header


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


@dataclass
class Sent:
    """What a set of clients measured: wall seconds, each request's latency and its replica's stages (the
    ``Server-Timing`` header; empty for /health), and this process's CPU seconds meanwhile."""

    wall: float
    latencies: list[float]
    stages: list[dict[str, float]]
    cpu: float


def _clients(port: int, bodies: Sequence[bytes | None], clients: int) -> Sent:
    """Send ``bodies`` to /search (None: a GET of /health) from ``clients`` threads (one keep-alive connection
    each, an equal share of the bodies each, one after another)."""
    from raydist.serving.deployment import read_timing_header

    latencies: list[float] = []
    stages: list[dict[str, float]] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(share: Sequence[bytes]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        mine, timed = [], []
        for body in share:
            start = time.perf_counter()
            if body is None:
                conn.request("GET", "/health")
            else:
                conn.request("POST", "/search", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            payload = response.read()
            mine.append(time.perf_counter() - start)
            timed.append(read_timing_header(response.getheader("Server-Timing")))
            if response.status != 200:
                errors.append(f"{response.status} {payload[:200]!r}")
        conn.close()
        with lock:
            latencies.extend(mine)
            stages.extend(timed)

    workers = [threading.Thread(target=client, args=(bodies[i::clients],)) for i in range(clients)]
    cpu, start = time.process_time(), time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    if errors:
        raise RuntimeError(f"serve benchmark: {len(errors)} requests failed, e.g. {errors[0]}")
    return Sent(wall, latencies, stages, cpu)


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


@dataclass
class Measured:
    """One (mode, clients) cell over the rounds: requests/s per round, latencies, replica stages, client CPU
    seconds and requests sent."""

    rates: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    stages: list[dict[str, float]] = field(default_factory=list)
    cpu: float = 0.0
    sent: int = 0

    def add(self, got: Sent) -> None:
        self.rates.append(len(got.latencies) / got.wall)
        self.latencies += got.latencies
        self.stages += got.stages
        self.cpu += got.cpu
        self.sent += len(got.latencies)


def _serve_rounds(
    port: int,
    retriever,
    queries: Sequence[str],
    modes: Sequence[str],
    repeats: int,
    clients: Sequence[int],
    floor: dict[str, Measured] | None,
) -> dict[tuple[str, int], Measured]:
    """Per mode and client count the server's measurements; with ``floor`` the in-process ones per mode go there
    too. Every mode and client count runs once per round, in turn."""
    out = {(m, c): Measured() for m in modes for c in clients}
    warm = [json.dumps({"texts": [q], "k": K}).encode() for q in queries[:WARMUP]]
    _clients(port, warm, max(clients))
    for _ in range(repeats):
        for mode in modes:
            if mode == HEALTH:
                bodies: list[bytes | None] = [None] * len(queries)
            else:
                bodies = [json.dumps({"texts": [q], "k": K, "mode": mode}).encode() for q in queries]
            for c in clients:
                out[(mode, c)].add(_clients(port, bodies if c > 1 else bodies[: len(bodies) // 4], c))
            if floor is not None and mode != HEALTH:
                with threads(1):
                    wall, times = _in_process(retriever, queries, mode)
                cell = floor.setdefault(mode, Measured())
                cell.rates.append(len(queries) / wall)
                cell.latencies += times
    return out


def _breakdown(label: str, clients: int, m: Measured) -> str:
    """A row of where a request's time went: mean milliseconds per stage in the replica, outside it (HTTP,
    Serve's proxy and the hop), the mean batch and the clients' CPU per request."""
    latency = 1e3 * float(np.mean(m.latencies))
    if not any(m.stages):  # /health: no Server-Timing header
        return row(
            label, clients, f"{latency:.1f}", *["—"] * (len(STAGES) + 2), f"{1e3 * m.cpu / m.sent:.2f}"
        )
    mean = {s: 1e3 * float(np.mean([t.get(s, 0.0) for t in m.stages])) for s in STAGES}
    batch = float(np.mean([t.get("batch", 1.0) for t in m.stages]))
    cells = [f"{mean[s]:.1f}" for s in STAGES]
    outside = f"{latency - mean['replica']:.1f}"
    return row(
        label, clients, f"{latency:.1f}", *cells, outside, f"{batch:.1f}", f"{1e3 * m.cpu / m.sent:.2f}"
    )


@register_benchmark("serve", order=15, ray=True)
def serve_rate(*, smoke: bool, repeats: int) -> str:
    """Requests/s, p50/p99 of `raydist serve` /search (1 and 8 clients, loopback): flat, adaptive, funnel; in process.

    Each search mode through Ray Serve at 1 and 8 concurrent clients against the Embedder + FAISS called in this
    process (the floor), where each request's time went (the replica's Server-Timing header); then flat search
    again with batching off (``--max-batch 1``; not in smoke mode)."""
    from raydist.distributed.spawn import free_port
    from raydist.serving.deployment import deploy, stop

    sizes = SMOKE if smoke else FULL
    floor: dict[str, Measured] = {}
    results: dict[tuple[str, int], Measured] = {}
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
        for options in batching:
            port = free_port()
            served = deploy(checkpoint, index=index, port=port, replica_cpus=0.5, options=options)
            try:
                if options.max_batch > 1:
                    rounds = _serve_rounds(
                        port, retriever, queries, (*MODES, HEALTH), repeats, CLIENTS, floor
                    )
                else:
                    alone = _serve_rounds(port, retriever, queries, ("flat",), repeats, CLIENTS[-1:], None)
                    rounds = {("flat, batching off", c): m for (_, c), m in alone.items()}
            finally:
                stop(served)
            results |= rounds
    options = ServeOptions()
    what = (
        f"{sizes['requests']} requests per mode and round at {CLIENTS[-1]} clients, {sizes['requests'] // 4} at 1 "
        f"(one caption each, k = {K}, full dim 256), concurrent clients on 127.0.0.1, database N = "
        f"{sizes['database']:,}; {repeats} round(s). Requests/s as median (min–max) over rounds; latencies pooled. "
        f"Batching: the requests waiting when a batch ends, up to {options.max_batch}, "
        f"{1e3 * options.batch_wait_s:g} ms wait. The floor: one caller in this process, one thread."
    )
    lines = [
        what,
        "",
        row(
            "search",
            "clients",
            "serve req/s",
            "serve p50 ms",
            "serve p99 ms",
            "in-process req/s",
            "in-process p50 ms",
            "in-process p99 ms",
            "serve / in-process",
        ),
        "|" + "---|" * 9,
    ]
    for (label, clients), m in results.items():
        served = [label, clients, spread(m.rates), _ms(m.latencies, 0.5), _ms(m.latencies, 0.99)]
        if label == HEALTH:
            lines.append(row(*served, "—", "—", "—", "—"))
            continue
        base = floor[label.split(",")[0]]  # batching off: against flat search's floor
        ratio = statistics.median(m.rates) / statistics.median(base.rates)
        floor_cells = [spread(base.rates), _ms(base.latencies, 0.5), _ms(base.latencies, 0.99)]
        lines.append(row(*served, *floor_cells, f"{ratio:.2f}×"))
    lines += [
        "",
        "Where a request's time went: mean ms per request; the stages from the replica's Server-Timing header "
        "(queue: waiting for its batch; embed, search: its batch's), outside = client latency − replica (HTTP, "
        "Serve's proxy and the hop to the replica); batch: mean requests per batch; client CPU: the bench "
        "clients' own CPU ms per request.",
        "",
        row("search", "clients", "client latency", *STAGES, "outside", "batch", "client CPU"),
        "|" + "---|" * (len(STAGES) + 6),
    ]
    lines += [_breakdown(label, clients, m) for (label, clients), m in results.items()]
    return "\n".join(lines)
