"""What a served model does, without HTTP or Ray: load a checkpoint and its index, check a request body field by
field (a :class:`RequestError` names the field), and answer a batch of embed and search requests at once.

The HTTP routes and the Ray Serve deployment around it live in :mod:`raydist.serving.deployment`.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image
from pydantic import BaseModel, ConfigDict, ValidationError

from raydist.data.image_bytes import ImageTooLargeError, open_image
from raydist.data.schema import SPLITS
from raydist.retrieval.embedder import Embedder
from raydist.retrieval.index import FaissIndex, build_indexes, unit_rows
from raydist.retrieval.query import index_database, open_index
from raydist.retrieval.search import search
from raydist.retrieval.trained import ALL_SPLITS, load_trained

INPUT_FIELDS = ("texts", "images", "features")


@dataclass(frozen=True)
class ServeOptions:
    """The server's limits and batching: at most ``max_items`` inputs per request and ``max_body_bytes`` per
    body; a replica answers the requests waiting when its last batch ends together, up to ``max_batch`` of them
    (:class:`raydist.serving.batcher.Batcher`), the first of a batch on an idle replica waiting ``batch_wait_s``
    for others (0: not at all); adaptive and funnel search shortlist ``shortlist`` rows (at least k) at their
    first dim."""

    max_items: int = 256
    max_body_bytes: int = 8 << 20
    max_batch: int = 16
    batch_wait_s: float = 0.0
    shortlist: int = 200

    def __post_init__(self) -> None:
        flags = {"max_items": "--max-items", "max_body_bytes": "--max-body-mb", "max_batch": "--max-batch"}
        for name in ("max_items", "max_body_bytes", "max_batch", "shortlist"):
            if getattr(self, name) < 1:
                flag = flags.get(name, f"--{name}")
                raise ValueError(f"{flag} ({name}={getattr(self, name)}): expected at least 1")
        if self.batch_wait_s < 0:
            raise ValueError(f"--batch-wait-ms (batch_wait_s={self.batch_wait_s}): expected >= 0")


BLAS_FROM_QUERIES = (
    3  # FAISS's flat search as one matrix product from this many queries on. Measured at 100,000
)
# x 256, one thread: 1 / 2 / 4 / 8 queries in 9.5 / 18 / 35 / 68 ms scanning the rows once per query (FAISS's
# choice at up to 16 queries here), in 22 / 23 / 24 / 26 ms as a matrix product.


def compute_threads(threads: int) -> None:
    """A replica's compute threads: torch and FAISS (OpenMP, and OpenBLAS under it) at ``threads``. Process-wide:
    call it in a process of its own (a replica)."""
    import faiss
    import torch

    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)


@contextmanager
def blas_for(queries: int) -> Iterator[None]:
    """FAISS's flat searches inside the block as one matrix product (``distance_compute_blas_threshold`` 1) when
    there are at least :data:`BLAS_FROM_QUERIES` ``queries``, so that a batch reads the database once rather than
    once per query; FAISS's own choice otherwise. Process-wide while it lasts: one search at a time (a replica's
    batcher)."""
    import faiss

    if queries < BLAS_FROM_QUERIES:
        yield
        return
    before = faiss.cvar.distance_compute_blas_threshold
    faiss.cvar.distance_compute_blas_threshold = 1
    try:
        yield
    finally:
        faiss.cvar.distance_compute_blas_threshold = before


class RequestError(Exception):
    """A request the server refuses: the HTTP ``status`` (4xx), the ``field`` to blame and what was expected."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.status, self.field, self.message = status, field, message

    def payload(self) -> dict[str, str]:
        """The JSON body of the error response."""
        return {"error": f"{self.field}: {self.message}", "field": self.field}


class _Inputs(BaseModel):
    """One of ``texts`` (strings), ``images`` (base64 PNG/JPEG) or ``features`` (vectors)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    texts: list[str] | None = None
    images: list[str] | None = None
    features: list[list[float]] | None = None
    dim: int | None = None


class EmbedRequest(_Inputs):
    """``POST /embed``: one input list; ``dim`` cuts a Matryoshka prefix (re-normalised)."""


class SearchRequest(_Inputs):
    """``POST /search``: one input list, ``k`` results per query at ``dim`` (default: the index's largest) by
    ``mode``: flat (the index at dim), adaptive (shortlist at the smallest dim, re-rank at dim) or funnel."""

    k: int = 10
    mode: Literal["flat", "adaptive", "funnel"] = "flat"


@dataclass(frozen=True)
class Job:
    """A checked request: its input kind and inputs, the dim, and for a search ``k`` and ``mode``."""

    kind: str  # texts | images | features
    inputs: list[Any] | np.ndarray
    dim: int
    search: bool = False
    k: int = 0
    mode: str = "flat"


class Retriever:
    """A trained model (:class:`raydist.retrieval.embedder.Embedder`, full-dim outputs) and a FAISS index per
    dim over a database whose rows carry dataset ids; ``database`` holds the unit rows at the largest indexed
    dim, which the adaptive and funnel re-ranks re-normalise prefix by prefix."""

    def __init__(
        self,
        embedder: Embedder,
        indexes: dict[int, FaissIndex],
        database: np.ndarray,
        ids: np.ndarray,
        source: str,
        options: ServeOptions,
    ) -> None:
        self.embedder = embedder
        self.indexes = indexes
        self.database = unit_rows(database)
        self.ids = ids
        self.source = source  # what --index named
        self.options = options
        self.full_dim = embedder.trained.config.model.embed_dim
        self.dims = embedder.trained.retrieval_dims()  # the nested dims; a plain model's are raydist index's
        self.batch_blas = False  # a replica's: batches searched through BLAS (blas_for)

    def health(self) -> dict[str, Any]:
        """What ``GET /health`` reports: the checkpoint, the task, the dims and the index."""
        return {
            "status": "ok",
            "checkpoint": str(self.embedder.trained.checkpoint_path),
            "task": self.embedder.trained.task.name,
            "embed_dims": self.dims,
            "index": self.source,
            "index_dims": sorted(self.indexes),
            "num_database": len(self.ids),
        }

    # ---- requests -------------------------------------------------------------------------------------------

    def parse(self, body: bytes, *, search: bool) -> Job:
        """A request body checked against the limits, the model and the index: a :class:`Job`, or a
        :class:`RequestError` naming the field (400 invalid JSON, 413 too large, 422 a bad field)."""
        if len(body) > self.options.max_body_bytes:
            raise RequestError(413, "body", f"{len(body)} bytes; at most {self.options.max_body_bytes}")
        try:
            raw = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(400, "body", f"invalid JSON ({e})") from e
        model = SearchRequest if search else EmbedRequest
        try:
            request = model.model_validate(raw)
        except ValidationError as e:
            error = e.errors()[0]
            field = ".".join(str(part) for part in error["loc"]) or "body"
            if error["type"] == "extra_forbidden":  # name what the route takes
                raise RequestError(
                    422, field, f"unknown field; accepted: {', '.join(model.model_fields)}"
                ) from e
            raise RequestError(422, field, error["msg"]) from e
        given = [name for name in INPUT_FIELDS if getattr(request, name) is not None]
        if len(given) != 1:
            raise RequestError(
                422, "/".join(given) or "texts", f"give exactly one of {', '.join(INPUT_FIELDS)}"
            )
        kind = given[0]
        items = getattr(request, kind)
        if not 1 <= len(items) <= self.options.max_items:
            raise RequestError(
                422,
                kind,
                f"{len(items)} items; expected 1 to {self.options.max_items} (the server's max items)",
            )
        inputs = self._inputs(kind, items)
        if not search:
            return Job(kind, inputs, self._embed_dim(request.dim))
        dim = self._search_dim(request.dim)
        if not 1 <= request.k <= len(self.ids):
            raise RequestError(422, "k", f"{request.k}; expected 1 <= k <= {len(self.ids)} (the index size)")
        if request.mode != "flat" and not [d for d in self.indexes if d < dim]:
            raise RequestError(
                422,
                "mode",
                f"{request.mode} search needs an index dim below dim={dim}; the index has "
                f"{sorted(self.indexes)}",
            )
        return Job(kind, inputs, dim, True, request.k, request.mode)

    def _inputs(self, kind: str, items: list[Any]) -> list[Any] | np.ndarray:
        task = self.embedder.trained.task.name
        info = self.embedder.trained.data_info
        if kind == "texts" and task != "pairs":
            raise RequestError(422, kind, f"a {task!r} model has no text side; send features or images")
        if kind == "features":
            want = f"expected vectors of {info.feature_dim} finite numbers (the model's feature_dim)"
            if any(len(row) != info.feature_dim for row in items):
                raise RequestError(422, kind, want)
            x = np.asarray(items, dtype=np.float64)
            if not np.isfinite(x).all():
                raise RequestError(422, kind, want)
            return x
        if kind == "images":
            if not info.encoded:
                raise RequestError(422, kind, "this model was trained on feature vectors; send features")
            return [_decode_image(i, item) for i, item in enumerate(items)]
        return items

    def _embed_dim(self, dim: int | None) -> int:
        if dim is None:
            return self.full_dim
        if dim not in self.dims:
            raise RequestError(422, "dim", f"{dim}; the model serves dims {self.dims}")
        return dim

    def _search_dim(self, dim: int | None) -> int:
        if dim is None:
            return max(self.indexes)
        if dim not in self.indexes:
            raise RequestError(422, "dim", f"{dim}; the index has dims {sorted(self.indexes)}")
        return dim

    # ---- answers --------------------------------------------------------------------------------------------

    def run(self, jobs: Sequence[Job], parts: dict[str, float] | None = None) -> list[dict[str, Any]]:
        """The answers of a batch of checked requests, in order: each input kind embedded in one call, each
        (mode, dim, k) searched in one call. ``parts``, if given, gets the seconds spent embedding and searching
        (``embed``, ``search``; the answers' lists included)."""
        start = time.perf_counter()
        vectors = self._embed_all(jobs)
        embedded = time.perf_counter()
        answers: list[dict[str, Any]] = [{} for _ in jobs]
        searches: dict[tuple[str, int, int], list[int]] = defaultdict(list)
        for j, job in enumerate(jobs):
            if job.search:
                searches[(job.mode, job.dim, job.k)].append(j)
            else:
                z = vectors[j] if job.dim == self.full_dim else unit_rows(vectors[j][:, : job.dim])
                answers[j] = {"embeddings": z.tolist(), "dim": job.dim}
        for (mode, dim, k), members in searches.items():
            queries = np.concatenate([vectors[j] for j in members])
            scores, rows = self.search(queries, k=k, dim=dim, mode=mode)
            start_row = 0
            for j in members:
                n = len(vectors[j])
                end = start_row + n
                answers[j] = {"results": self._results(scores[start_row:end], rows[start_row:end])}
                start_row = end
        if parts is not None:
            parts["embed"] = embedded - start
            parts["search"] = time.perf_counter() - embedded
        return answers

    def search(self, queries: np.ndarray, *, k: int, dim: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
        """Top-k database rows [Q, k] and their cosines at ``dim`` by ``mode`` (flat, adaptive or funnel, the
        shortlist of :class:`ServeOptions`): :func:`raydist.retrieval.search.search`; with ``batch_blas`` (a
        replica's, one search at a time) a batch of queries through BLAS (:func:`blas_for`)."""
        with blas_for(len(queries)) if self.batch_blas else nullcontext():
            return search(
                self.indexes,
                queries,
                k,
                dim=dim,
                mode=mode,
                shortlist=self.options.shortlist,
                database=self.database,
            )

    def _embed_all(self, jobs: Sequence[Job]) -> list[np.ndarray]:
        """Every job's full-dim embeddings, one model call per input kind."""
        out: list[np.ndarray] = [np.empty(0)] * len(jobs)
        for kind in INPUT_FIELDS:
            members = [j for j, job in enumerate(jobs) if job.kind == kind]
            if not members:
                continue
            if kind == "features":
                z = self.embedder.embed_features(np.concatenate([jobs[j].inputs for j in members]))
            else:
                joined = [x for j in members for x in jobs[j].inputs]
                z = (
                    self.embedder.embed_texts(joined)
                    if kind == "texts"
                    else self.embedder.embed_images(joined)
                )
            start = 0
            for j in members:
                out[j] = z[start : start + len(jobs[j].inputs)]
                start += len(jobs[j].inputs)
        return out

    def _results(self, scores: np.ndarray, rows: np.ndarray) -> list[list[dict[str, Any]]]:
        """Per query its hits, best first: ``{"id", "score"}`` with plain Python numbers (one ``tolist`` per
        array rather than a conversion per hit); rows FAISS left empty (-1) dropped."""
        found = rows >= 0
        ids = self.ids[np.where(found, rows, 0)].tolist()
        return [
            [{"id": i, "score": s} for i, s, ok in zip(qi, qs, qf, strict=True) if ok]
            for qi, qs, qf in zip(ids, scores.tolist(), found.tolist(), strict=True)
        ]


def _decode_image(i: int, item: str) -> Image.Image:
    """``images[i]``: base64 of PNG/JPEG bytes → a loaded Pillow image (RequestError otherwise)."""
    try:
        data = base64.b64decode(item, validate=True)
    except (binascii.Error, ValueError) as e:
        raise RequestError(422, f"images.{i}", f"not base64 ({e})") from e
    try:
        image = open_image(data)  # the pixel limit, from the header
        image.load()
    except ImageTooLargeError as e:
        raise RequestError(413, f"images.{i}", str(e)) from e
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise RequestError(422, f"images.{i}", f"not a decodable PNG/JPEG image ({e})") from e
    return image


def load_retriever(
    checkpoint: str | Path,
    index: str = ALL_SPLITS,
    *,
    data_dir: str | Path | None = None,
    latest: bool = False,
    options: ServeOptions | None = None,
) -> Retriever:
    """A checkpoint (or run folder: its best checkpoint) and what it searches: ``index`` a split name or
    ``all`` (that split of the dataset embedded now, a flat index at each of
    :meth:`raydist.retrieval.trained.Trained.retrieval_dims`, as ``raydist index`` builds them), or an index
    folder written by ``raydist index`` (its vectors, dims and ids; the checkpoint given embeds the queries)."""
    options = options or ServeOptions()
    if index in (*SPLITS, ALL_SPLITS):
        trained = load_trained(checkpoint, data_dir, latest=latest)
        rset = trained.embed(index)
        indexes = build_indexes(rset, trained.retrieval_dims(), "flat")  # as `raydist index` builds them
        database = rset.database[:, : max(indexes)]
        return Retriever(Embedder(trained), indexes, database, rset.database_ids, index, options)
    folder = Path(index)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"--index {index}: expected a split ({', '.join(SPLITS)}), {ALL_SPLITS!r} or an index folder "
            "written by `raydist index`"
        )
    indexes, meta, embedder = open_index(folder, checkpoint)
    database = index_database(indexes)
    return Retriever(embedder, indexes, database, meta["database_ids"], str(folder), options)
