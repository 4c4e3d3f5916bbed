"""Who may call `raydist serve` (raydist/serving/access.py): the key compared as a SHA-256 in constant time, the
per-client rate in a one-second window, /health open, the warning for a server on a public host without a key;
and over HTTP (one deployment on the session's Ray): 401 without the key or with a wrong one, 200 with it,
/health and the docs' routes as the rules say, 429 beyond the rate."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_retrieval_embedder import _checkpoint
from test_serving_service import QUERIES

from raydist.cli import main
from raydist.distributed.spawn import free_port
from raydist.serving.access import AccessRules, Gate, exposure_warning, key_digest
from raydist.serving.deployment import deploy, stop

KEY = "s3cret-key"


def test_the_gate_wants_the_key_on_every_route_but_health():
    gate = Gate(AccessRules(key_digest(KEY)))
    assert gate.refusal("/health", None, "a") is None
    assert gate.refusal("/embed", f"Bearer {KEY}", "a") is None
    assert gate.refusal("/search", f"bearer  {KEY} ", "a") is None  # the scheme in any case, spaces around
    for header in (None, "", KEY, f"Basic {KEY}", f"Bearer {KEY}x", "Bearer "):
        status, field, _ = gate.refusal("/embed", header, "a")
        assert (status, field) == (401, "Authorization"), header
    assert gate.refusal("/docs", None, "a")[0] == 401
    assert Gate(AccessRules()).refusal("/embed", None, "a") is None  # no key asked for


def test_the_gate_counts_each_clients_requests_in_a_one_second_window():
    now = [0.0]
    gate = Gate(AccessRules(max_requests_per_s=3), clock=lambda: now[0])
    assert [gate.refusal("/embed", None, "a") for _ in range(3)] == [None] * 3
    status, field, message = gate.refusal("/embed", None, "a")
    assert (status, field) == (429, "rate") and "more than 3 requests in one second from a" in message
    assert gate.refusal("/embed", None, "b") is None  # another client has its own count
    assert gate.refusal("/health", None, "a") is None  # /health is never limited
    now[0] = 0.999
    assert gate.refusal("/embed", None, "a")[0] == 429
    now[0] = 1.0  # the first three are a second old
    assert [gate.refusal("/embed", None, "a") for _ in range(3)] == [None] * 3


def test_rules_read_the_key_from_the_environment_and_warn_for_a_public_host(monkeypatch):
    monkeypatch.setenv("RAYDIST_TEST_KEY", KEY)
    rules = AccessRules.from_env("RAYDIST_TEST_KEY", 5)
    assert rules == AccessRules(key_digest(KEY), 5) and KEY not in repr(rules)
    monkeypatch.setenv("RAYDIST_TEST_KEY", "")
    with pytest.raises(ValueError, match="--api-key-env RAYDIST_TEST_KEY: the environment variable"):
        AccessRules.from_env("RAYDIST_TEST_KEY")
    with pytest.raises(ValueError, match="--max-requests-per-s 0"):
        AccessRules.from_env(None, 0)
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert exposure_warning(host, AccessRules()) is None
    for host in ("0.0.0.0", "192.168.1.5", "::", "example.org"):
        assert "without --api-key-env" in exposure_warning(host, AccessRules())
        assert exposure_warning(host, rules) is None


def test_raydist_serve_refuses_an_unset_key_variable_before_anything_starts(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("RAYDIST_TEST_UNSET", raising=False)
    assert main(["serve", str(tmp_path), "--api-key-env", "RAYDIST_TEST_UNSET"]) == 2
    err = capsys.readouterr().err
    assert "--api-key-env RAYDIST_TEST_UNSET: the environment variable RAYDIST_TEST_UNSET is unset" in err


def _request(url: str, body: bytes | None = None, key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    req = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.slow
def test_over_http_401_without_the_key_200_with_it_and_429_beyond_the_rate(
    ray_cluster, tiny_dataset, tmp_path
):
    ckpt = _checkpoint(tmp_path / "run" / "checkpoint_00000001", tiny_dataset)
    rate = 5
    running = deploy(
        ckpt.parent,
        index="val",
        port=free_port(),
        replica_cpus=0.25,
        access=AccessRules(key_digest(KEY), rate),
    )
    try:
        url = running.url
        body = json.dumps({"texts": QUERIES[:2]}).encode()
        assert _request(f"{url}/health")[0] == 200  # open
        status, answer = _request(f"{url}/embed", body)
        assert status == 401 and answer["field"] == "Authorization"
        assert _request(f"{url}/embed", body, key="wrong")[0] == 401
        assert _request(f"{url}/openapi.json")[0] == 401
        status, answer = _request(f"{url}/embed", body, key=KEY)
        assert status == 200 and len(answer["embeddings"]) == 2
        with ThreadPoolExecutor(12) as pool:  # a burst from one client: at most `rate` in any second pass
            burst = list(pool.map(lambda _: _request(f"{url}/embed", body, key=KEY)[0], range(12)))
        assert burst.count(429) >= 12 - 2 * rate and set(burst) <= {200, 429}, burst
        assert _request(f"{url}/health")[0] == 200  # never limited
    finally:
        stop(running)
