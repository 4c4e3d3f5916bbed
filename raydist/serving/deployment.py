"""``raydist serve``: a :class:`raydist.serving.service.Retriever` behind HTTP with Ray Serve -- FastAPI routes
(``/health``, ``/embed``, ``/search``, OpenAPI docs at ``/docs``) through Serve's ingress, the requests waiting
answered together (:class:`raydist.serving.batcher.Batcher`), each answer's stages in its ``Server-Timing``
header, on a private local Ray or a cluster, stopped cleanly by SIGINT/SIGTERM; every request but
``/health`` first passes the replica's :class:`raydist.serving.access.Gate` (key, rate)."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations (``Request``) as objects.
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from ray import serve
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from raydist.checkpoint import read_config
from raydist.console import warn
from raydist.data.schema import SPLITS
from raydist.retrieval.trained import ALL_SPLITS, choose_trained
from raydist.runtime import init_ray
from raydist.serving.access import AccessRules, Gate, exposure_warning
from raydist.serving.batcher import Batcher
from raydist.serving.service import (
    EmbedRequest,
    Job,
    RequestError,
    SearchRequest,
    ServeOptions,
    compute_threads,
    load_retriever,
)
from raydist.uris import is_uri

APP_NAME = "raydist"

api = FastAPI(
    title="raydist serve",
    description="Embeddings and nearest-neighbour search of a trained raydist model (Matryoshka dims: flat, "
    "adaptive and funnel search).",
)


def _body(model: type) -> dict[str, Any]:
    """The OpenAPI request body of a route that reads its JSON itself (to name the field of every error)."""
    schema = model.model_json_schema()
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


class AccessCheck:
    """ASGI middleware: 401 without the key, 429 beyond the client's rate (:class:`raydist.serving.access.Gate`),
    before a route runs; the replica's gate is ``app.state.gate`` (one replica per process). Plain ASGI rather
    than ``@app.middleware("http")``, whose wrapper streams every response through a second task."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gate = getattr(scope["app"].state, "gate", None) if scope["type"] == "http" else None
        if gate is not None:
            headers = Headers(scope=scope)
            client = scope["client"][0] if scope.get("client") else "unknown"
            refusal = gate.refusal(scope["path"], headers.get("authorization"), client)
            if refusal:
                status, field, message = refusal
                extra = {"WWW-Authenticate": "Bearer"} if status == 401 else {"Retry-After": "1"}
                payload = RequestError(status, field, message).payload()
                await JSONResponse(payload, status_code=status, headers=extra)(scope, receive, send)
                return
        await self.app(scope, receive, send)


api.add_middleware(AccessCheck)


def timing_header(parts: dict[str, float], batch: int) -> str:
    """The ``Server-Timing`` header of an answer: each stage's milliseconds in the replica (``parse`` the body,
    ``queue`` for its batch, the batch's ``embed`` and ``search``, ``encode`` the JSON, ``replica`` all of it)
    and the batch's size."""
    stages = ", ".join(f"{name};dur={1e3 * seconds:.2f}" for name, seconds in parts.items())
    return f'{stages}, batch;desc="{batch}"'


def read_timing_header(header: str | None) -> dict[str, float]:
    """A :func:`timing_header` read back: each stage in seconds, and ``batch`` as a number."""
    out: dict[str, float] = {}
    for part in (header or "").split(","):
        name, _, value = part.strip().partition(";")
        if value.startswith("dur="):
            out[name] = float(value[4:]) / 1e3
        elif value.startswith("desc="):
            out[name] = float(value[5:].strip('"'))
    return out


@serve.deployment(name="Retriever", max_constructor_retry_count=1)
@serve.ingress(api)
class RetrieverDeployment:
    """One replica: the model and its index (:func:`raydist.serving.service.load_retriever`), ``threads`` compute
    threads, the routes, and a :class:`raydist.serving.batcher.Batcher` that answers the requests waiting
    together."""

    def __init__(
        self,
        checkpoint: str,
        index: str,
        data_dir: str | None,
        latest: bool,
        options: ServeOptions,
        access: AccessRules,
        threads: int = 1,
    ) -> None:
        api.state.gate = Gate(access)
        compute_threads(threads)
        self.retriever = load_retriever(checkpoint, index, data_dir=data_dir, latest=latest, options=options)
        self.retriever.batch_blas = True  # the batcher runs one batch at a time
        self.batcher: Batcher[Job, dict[str, Any]] = Batcher(
            self.retriever.run, options.max_batch, options.batch_wait_s
        )

    @api.get("/health")
    async def health(self) -> dict[str, Any]:
        """200 once the model and its index are loaded: the checkpoint, task, dims, index size and the replica
        that answered."""
        return {**self.retriever.health(), "replica": serve.get_replica_context().replica_id.unique_id}

    @api.post("/embed", openapi_extra=_body(EmbedRequest))
    async def embed(self, request: Request) -> Any:
        """``{"texts"|"images"|"features": [...], "dim"?: D}`` → ``{"embeddings": [[...], ...], "dim": D}``."""
        return await self._respond(request, search=False)

    @api.post("/search", openapi_extra=_body(SearchRequest))
    async def search(self, request: Request) -> Any:
        """``{"texts"|"images"|"features": [...], "k": K, "dim"?: D, "mode"?: "flat"|"adaptive"|"funnel"}``
        → ``{"results": [[{"id": ..., "score": ...}, ...], ...]}``, best first, ids as the dataset's."""
        return await self._respond(request, search=True)

    async def _respond(self, request: Request, *, search: bool) -> Response:
        start = time.perf_counter()
        limit = self.retriever.options.max_body_bytes
        length = request.headers.get("content-length", "")
        try:
            if length.isdigit() and int(length) > limit:  # refused before the body is read
                raise RequestError(413, "body", f"{length} bytes; at most {limit}")
            job = self.retriever.parse(await request.body(), search=search)
        except RequestError as e:
            return JSONResponse(e.payload(), status_code=e.status)
        parsed = time.perf_counter()
        done = await self.batcher.submit(job)
        answered = time.perf_counter()
        response = JSONResponse(done.answer)  # plain json.dumps: no jsonable_encoder walk of the floats
        end = time.perf_counter()
        parts = {"parse": parsed - start, "queue": done.queued_s, **done.parts}
        parts |= {"encode": end - answered, "replica": end - start}
        response.headers["Server-Timing"] = timing_header(parts, done.size)
        return response


@dataclass(frozen=True)
class Served:
    """A running deployment: its URL, whether this process started the Ray instance it runs on, and whether
    that instance is a cluster joined by address (whose Serve may hold other applications)."""

    url: str
    private_ray: bool
    cluster: bool


def check_index_arg(index: str) -> None:
    """``--index``: a split, ``all``, or an existing folder (checked before Ray starts)."""
    if index not in (*SPLITS, ALL_SPLITS) and not Path(index).is_dir():
        raise FileNotFoundError(
            f"--index {index}: expected a split ({', '.join(SPLITS)}), {ALL_SPLITS!r} or an index folder "
            "written by `raydist index`"
        )


def deploy(
    checkpoint: str | Path,
    *,
    index: str = ALL_SPLITS,
    data_dir: str | Path | None = None,
    latest: bool = False,
    host: str = "127.0.0.1",
    port: int = 8000,
    replicas: int = 1,
    replica_cpus: float = 0.5,
    options: ServeOptions | None = None,
    access: AccessRules | None = None,
    address: str | None = None,
    log_level: str = "WARNING",
) -> Served:
    """Deploy the model and its index with Ray Serve on ``host:port`` (``replicas`` replicas of
    ``replica_cpus`` logical CPUs each) and return once every replica has loaded them. Joins the cluster at
    ``address`` (or ``RAY_ADDRESS``), or the Ray this process already runs; else starts a private local one.
    Serve's own logs (and each request's access line, at INFO) show from ``log_level`` up. ``access``: the key
    and rate every request but ``/health`` is checked against; a server on a host other than loopback without a
    key is a warning."""
    import ray

    if replicas < 1 or replica_cpus < 0:
        raise ValueError(f"--replicas {replicas}, --replica-cpus {replica_cpus}: expected >= 1 and >= 0")
    check_index_arg(index)
    access = access or AccessRules()
    exposed = exposure_warning(host, access)
    if exposed:
        warn(exposed)
    chosen = choose_trained(checkpoint, latest=latest)
    # a missing or unreadable checkpoint: a clear error now, not in a replica's log (its plugins imported here)
    plugins = read_config(chosen.path).plugins
    cluster = bool(address or os.environ.get("RAY_ADDRESS"))
    private = not ray.is_initialized() and not cluster
    init_ray(replicas * replica_cpus, address, dashboard=False, plugins=plugins)

    def absolute(path: str | Path | None) -> str | None:  # replicas run in Ray's session folder
        if path is None or is_uri(str(path)):
            return None if path is None else str(path)
        return str(Path(path).expanduser().resolve())

    index_arg = index if index in (*SPLITS, ALL_SPLITS) else absolute(index)
    logging.getLogger("ray.serve").setLevel(log_level)  # this process's Serve lines ("Started Serve", ...)
    serve_logs = {"log_level": log_level, "enable_access_log": log_level in ("DEBUG", "INFO")}
    serve.start(http_options={"host": host, "port": port}, logging_config=serve_logs)
    options = options or ServeOptions()
    threads = max(1, int(replica_cpus))  # as many compute threads as whole CPUs reserved, at least one
    app = RetrieverDeployment.options(
        num_replicas=replicas,
        ray_actor_options={"num_cpus": replica_cpus},
        max_ongoing_requests=2 * options.max_batch,  # room for a full batch while the last one runs
    ).bind(absolute(checkpoint), index_arg, absolute(data_dir), latest, options, access, threads)
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False, logging_config=serve_logs)
    return Served(f"http://{host}:{port}", private, cluster)


def stop(served: Served) -> None:
    """Take the application down, its replicas stopping gracefully: on a cluster only this application; on a
    private Ray the application, then Ray (Serve's controller and proxy with it); on a Ray this process was
    already running (tests, benchmarks), Serve itself, so that its proxy lets go of the port."""
    import ray

    if served.cluster or served.private_ray:
        serve.delete(APP_NAME)
        if served.private_ray:
            ray.shutdown()
        return
    serve.shutdown()


def serve_until_stopped(say: Callable[[str], None] = print, **deploy_args: Any) -> int:
    """:func:`deploy`, say where it listens, then wait for SIGINT or SIGTERM and :func:`stop`."""
    stopping = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        stopping.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        served = deploy(**deploy_args)
        if not stopping.is_set():
            say(
                f"serving on {served.url} (docs {served.url}/docs): GET /health, POST /embed, POST /search; "
                "Ctrl-C stops"
            )
        stopping.wait()
        say(f"stopping on {signal.Signals(received[0]).name}")
        stop(served)
        say("stopped")
        return 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
