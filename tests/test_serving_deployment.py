"""`raydist serve` over HTTP (raydist.serving.deployment): a tiny run deployed with Ray Serve on a free loopback
port of the session's Ray. /embed equals the Embedder in process; /search equals `raydist search` (its printed
ids); concurrent requests (answered in batches) get their own answers, those of `raydist search`, each with its
stages in a Server-Timing header; every bad request gets a 4xx JSON
error naming the field and /health stays 200; the OpenAPI docs. The command itself, with a private Ray, stopped
by SIGINT: the cluster step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from test_retrieval_embedder import _checkpoint
from test_serving_service import BAD_REQUESTS, QUERIES

from raydist.cli import main
from raydist.distributed.spawn import free_port
from raydist.retrieval.embedder import Embedder
from raydist.retrieval.query import search_index
from raydist.retrieval.trained import write_checkpoint_indexes
from raydist.serving.deployment import deploy, read_timing_header, stop
from raydist.serving.service import ServeOptions


def request(url: str, body: bytes | None = None) -> tuple[int, dict]:
    """(status, JSON body) of a GET (no body) or a POST."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def served(ray_cluster, tiny_dataset, tmp_path_factory):
    """A pairs checkpoint nested at 16/32/64 and its test split's index folder, served on a free port."""
    root = tmp_path_factory.mktemp("served")
    ckpt = _checkpoint(root / "run" / "checkpoint_00000001", tiny_dataset, **{"model.nesting": [16, 32]})
    write_checkpoint_indexes(ckpt, root / "index", split="test")
    running = deploy(
        ckpt.parent,
        index=str(root / "index"),
        port=free_port(),
        replica_cpus=0.25,
        options=ServeOptions(max_items=8, max_body_bytes=1000, shortlist=24),
    )
    assert not running.private_ray  # the session's Ray
    yield running.url, ckpt, root / "index"
    stop(running)


@pytest.mark.slow
def test_embed_equals_the_embedder_in_process(served):
    url, ckpt, _ = served
    for dim in (None, 16):
        body = {"texts": QUERIES} | ({"dim": dim} if dim else {})
        status, answer = request(f"{url}/embed", json.dumps(body).encode())
        assert status == 200 and answer["dim"] == (dim or 64)
        z = np.asarray(answer["embeddings"], dtype=np.float64)
        ref = Embedder.from_checkpoint(ckpt, dim=dim).embed_texts(QUERIES).astype(np.float64)
        cos = (z * ref).sum(1) / np.linalg.norm(z, axis=1) / np.linalg.norm(ref, axis=1)
        assert cos.min() >= 0.9999


def _printed_ids(out: str) -> list[list[int]]:
    """The ids `raydist search` prints, per query."""
    ids: list[list[int]] = []
    for line in out.splitlines():
        if line.startswith("query "):
            ids.append([])
        elif " id " in line and ids:
            ids[-1].append(int(line.split(" id ")[1].split()[0]))
    return ids


@pytest.mark.slow
def test_search_equals_raydist_search(served, tmp_path, capsys):
    url, _, index = served
    queries = tmp_path / "queries.txt"
    queries.write_text("\n".join(QUERIES) + "\n")
    assert main(["search", "--index", str(index), "--queries", str(queries), "--k", "6"]) == 0
    expected = _printed_ids(capsys.readouterr().out)
    assert len(expected) == len(QUERIES) and all(len(ids) == 6 for ids in expected)
    status, answer = request(f"{url}/search", json.dumps({"texts": QUERIES, "k": 6}).encode())
    assert status == 200
    assert [[hit["id"] for hit in hits] for hits in answer["results"]] == expected
    for mode in ("adaptive", "funnel"):  # k results, best first
        status, answer = request(
            f"{url}/search", json.dumps({"texts": QUERIES, "k": 6, "mode": mode}).encode()
        )
        assert status == 200
        for hits in answer["results"]:
            scores = [hit["score"] for hit in hits]
            assert len(hits) == 6 and scores == sorted(scores, reverse=True)


def _timed(url: str, body: bytes) -> tuple[int, dict, dict[str, float]]:
    """(status, JSON body, the Server-Timing header's stages in seconds and ``batch``) of a POST."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, json.loads(r.read()), read_timing_header(r.headers["Server-Timing"])


@pytest.mark.slow
def test_concurrent_requests_get_their_own_answers(served):
    url, _, index = served
    bodies = [json.dumps({"texts": [q], "k": 4, "dim": 32}).encode() for q in QUERIES * 4]
    expected = search_index(index, QUERIES, k=4, dim=32)  # in process, one scan per query
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda b: _timed(f"{url}/search", b), bodies))
    for i, (status, answer, timing) in enumerate(together):
        assert status == 200
        assert [h["id"] for h in answer["results"][0]] == expected.ids[i % len(QUERIES)].tolist()
        np.testing.assert_allclose(
            [h["score"] for h in answer["results"][0]], expected.scores[i % len(QUERIES)], atol=1e-5
        )
        assert set(timing) == {"parse", "queue", "embed", "search", "encode", "replica", "batch"}
        assert 1 <= timing["batch"] <= 16 and min(timing.values()) >= 0
        stages = sum(timing[s] for s in ("parse", "queue", "embed", "search", "encode"))
        assert stages <= timing["replica"] + 1e-3  # the replica's stages, each rounded to 0.01 ms


@pytest.mark.slow
def test_every_bad_request_gets_a_4xx_naming_the_field_and_the_server_keeps_serving(served):
    url, _, _ = served
    for body, search, status, field in BAD_REQUESTS:
        got, answer = request(f"{url}/{'search' if search else 'embed'}", body)
        assert (got, answer.get("field")) == (status, field), (body[:60], answer)
        assert field in answer["error"]
    assert request(f"{url}/health")[0] == 200
    status, health = request(f"{url}/health")
    assert (
        health["task"] == "pairs" and health["index_dims"] == [16, 32, 64] and health["num_database"] == 100
    )
    with urllib.request.urlopen(f"{url}/openapi.json", timeout=30) as r:
        spec = json.loads(r.read())
    assert {"/health", "/embed", "/search"} <= set(spec["paths"])
    assert (
        "k"
        in spec["paths"]["/search"]["post"]["requestBody"]["content"]["application/json"]["schema"][
            "properties"
        ]
    )
    with urllib.request.urlopen(f"{url}/docs", timeout=30) as r:
        assert r.status == 200


@pytest.mark.cluster
@pytest.mark.slow
def test_raydist_serve_answers_then_stops_cleanly_on_sigint(tiny_dataset, tmp_path):
    ckpt = _checkpoint(tmp_path / "run" / "checkpoint_00000001", tiny_dataset, **{"model.nesting": [16, 32]})
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    serve = f"serve {ckpt.parent} --index test --port {port} --replicas 2 --replica-cpus 0.25"
    command = [sys.executable, "-m", "raydist.cli", *serve.split()]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.time() + 180
        while not any(line.startswith("serving on") for line in lines):  # deployed, signal handlers set
            assert proc.poll() is None and time.time() < deadline, "".join(lines)
            time.sleep(0.5)
        status, health = request(f"http://127.0.0.1:{port}/health")
        assert status == 200 and health["index"] == "test"
        replicas = {request(f"http://127.0.0.1:{port}/health")[1]["replica"] for _ in range(30)}
        assert len(replicas) == 2  # --replicas 2: Serve spreads the requests over both
        body = json.dumps({"texts": QUERIES[:1], "k": 3}).encode()
        status, answer = request(f"http://127.0.0.1:{port}/search", body)
        assert status == 200 and len(answer["results"][0]) == 3
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines)
    assert proc.returncode == 0, out
    assert "serving on http://127.0.0.1:" in out and "stopping on SIGINT" in out and "stopped" in out
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        request(f"http://127.0.0.1:{port}/health")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_deployment_and_the_handlers_are_restored(monkeypatch, signum):
    """serve_until_stopped with deploy and stop stubbed (no Ray): the signal ends the wait, stop runs once."""
    from raydist.serving import deployment

    calls: list[str] = []
    served = deployment.Served("http://127.0.0.1:1", private_ray=True, cluster=False)
    monkeypatch.setattr(deployment, "deploy", lambda **kw: calls.append("deploy") or served)
    monkeypatch.setattr(deployment, "stop", lambda s: calls.append(f"stop {s.url}"))
    before = signal.getsignal(signum)
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        if line.startswith("serving on"):
            threading.Timer(0.2, os.kill, (os.getpid(), signum)).start()

    assert deployment.serve_until_stopped(say, checkpoint="run") == 0
    assert calls == ["deploy", "stop http://127.0.0.1:1"]
    assert lines[1:] == [f"stopping on {signal.Signals(signum).name}", "stopped"]
    assert signal.getsignal(signum) is before


def test_the_timing_header_reads_back_as_written():
    from raydist.serving.deployment import timing_header

    header = timing_header({"parse": 0.0012, "queue": 0.0, "search": 0.25}, 3)
    assert header == 'parse;dur=1.20, queue;dur=0.00, search;dur=250.00, batch;desc="3"'
    assert read_timing_header(header) == {"parse": 0.0012, "queue": 0.0, "search": 0.25, "batch": 3.0}
    assert read_timing_header(None) == {}
