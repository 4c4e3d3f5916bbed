"""raydist.serving.service (what `raydist serve` answers, without HTTP or Ray): flat search equals `raydist search`
(search_index) on the same index folder and a split embedded on the spot; adaptive and funnel search against a
brute-force float64 numpy cascade; /embed's dims against the Embedder; images as base64; every bad request
refused with its status and the field named."""

from __future__ import annotations

import base64
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from object_store import upload
from test_retrieval_embedder import _checkpoint
from test_retrieval_embedder_images import shapes_ckpt  # noqa: F401  (a module fixture)

from raydist.retrieval.embedder import Embedder
from raydist.retrieval.query import search_index
from raydist.retrieval.trained import write_checkpoint_indexes
from raydist.serving.service import (
    BLAS_FROM_QUERIES,
    EmbedRequest,
    RequestError,
    SearchRequest,
    ServeOptions,
    compute_threads,
    load_retriever,
)

QUERIES = ["a white child sitting in the park", "two dogs on the grass", "a red bus", "zebra zebra"]


@pytest.fixture(scope="module")
def pairs_run(tiny_dataset, tmp_path_factory):
    """A pairs checkpoint nested at 16, 32 and 64 dims, and an index folder of its test split at those dims."""
    root = tmp_path_factory.mktemp("serve")
    ckpt = _checkpoint(root / "run" / "checkpoint_00000001", tiny_dataset, **{"model.nesting": [16, 32]})
    write_checkpoint_indexes(ckpt, root / "index", split="test")
    return ckpt, root / "index"


@pytest.fixture(scope="module")
def retriever(pairs_run):
    ckpt, index = pairs_run
    return load_retriever(ckpt, str(index), options=ServeOptions(max_items=8, shortlist=24))


def _body(**fields) -> bytes:
    return json.dumps(fields).encode()


def _ask(retriever, search: bool, **fields) -> dict:
    return retriever.run([retriever.parse(_body(**fields), search=search)])[0]


def test_flat_search_equals_raydist_search_on_an_index_folder_and_on_a_split(pairs_run, retriever):
    ckpt, index = pairs_run
    expected = search_index(index, QUERIES, k=7)
    answer = _ask(retriever, True, texts=QUERIES, k=7)
    ids = [[hit["id"] for hit in hits] for hits in answer["results"]]
    assert ids == expected.ids.tolist()
    scores = [[hit["score"] for hit in hits] for hits in answer["results"]]
    np.testing.assert_allclose(scores, expected.scores, atol=1e-6)
    # --index test: the same split embedded when the server starts, the same answers
    fresh = load_retriever(ckpt, "test")
    again = _ask(fresh, True, texts=QUERIES, k=7)
    assert [[hit["id"] for hit in hits] for hits in again["results"]] == ids
    at16 = search_index(index, QUERIES, k=5, dim=16).ids.tolist()
    assert [
        [h["id"] for h in hits] for hits in _ask(fresh, True, texts=QUERIES, k=5, dim=16)["results"]
    ] == at16


def test_a_batch_searched_as_a_replica_does_finds_what_each_query_finds_alone(retriever, monkeypatch):
    """A replica's search (batch_blas: a batch of at least BLAS_FROM_QUERIES queries through BLAS) on a batch of
    requests against each request answered alone with FAISS's defaults (one scan per query)."""
    import faiss

    alone = [_ask(retriever, True, texts=[q], k=7)["results"][0] for q in QUERIES]
    jobs = [retriever.parse(_body(texts=[q], k=7), search=True) for q in QUERIES]
    default = faiss.cvar.distance_compute_blas_threshold
    index = retriever.indexes[max(retriever.indexes)]
    seen: list[int] = []  # FAISS's threshold while the index searches

    def recording(queries: np.ndarray, k: int):
        seen.append(faiss.cvar.distance_compute_blas_threshold)
        return type(index).search(index, queries, k)

    monkeypatch.setattr(index, "search", recording)
    monkeypatch.setattr(retriever, "batch_blas", True)
    parts: dict[str, float] = {}
    together = retriever.run(jobs, parts)
    retriever.run(jobs[: BLAS_FROM_QUERIES - 1])  # too few queries: FAISS's own choice
    assert len(jobs) >= BLAS_FROM_QUERIES and seen == [1, default]
    assert faiss.cvar.distance_compute_blas_threshold == default  # restored
    assert set(parts) == {"embed", "search"} and min(parts.values()) >= 0
    for hits, expected in zip(together, alone, strict=True):
        assert [h["id"] for h in hits["results"][0]] == [h["id"] for h in expected]
        np.testing.assert_allclose(
            [h["score"] for h in hits["results"][0]], [h["score"] for h in expected], atol=1e-5
        )
        assert all(type(h["id"]) is int and type(h["score"]) is float for h in expected)


def test_compute_threads_sets_torch_and_faiss_threads():
    import faiss
    import torch

    before = torch.get_num_threads(), faiss.omp_get_max_threads()
    try:
        compute_threads(1)
        assert torch.get_num_threads() == 1 and faiss.omp_get_max_threads() == 1
    finally:
        torch.set_num_threads(before[0])
        faiss.omp_set_num_threads(before[1])


def _unit(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _brute_cascade(db: np.ndarray, q: np.ndarray, dims: list[int], keeps: list[int]) -> list[list[int]]:
    """A funnel in float64 numpy: all rows scored at dims[0], the best keeps[0] kept, re-scored at dims[1], …"""
    out = []
    for query in q:
        rows = np.arange(len(db))
        for dim, keep in zip(dims, keeps, strict=False):
            scores = _unit(db[rows, :dim]) @ _unit(query[None, :dim])[0]
            rows = rows[np.argsort(-scores, kind="stable")[:keep]]
        out.append(rows.tolist())
    return out


def test_adaptive_and_funnel_search_equal_a_brute_force_cascade(pairs_run, retriever):
    ckpt, _ = pairs_run
    db = retriever.database.astype(np.float64)  # the index's unit rows at 64 dims
    q = Embedder.from_checkpoint(ckpt).embed_texts(QUERIES)
    k = 5
    for mode, dims, keeps in (
        ("adaptive", [16, 64], [24, k]),  # shortlist 24 at the smallest dim, re-rank at 64
        ("funnel", [16, 32, 64], [24, 12, k]),  # default_funnel: shortlists halve from 24
    ):
        answer = _ask(retriever, True, texts=QUERIES, k=k, mode=mode)
        rows = _brute_cascade(db, q, dims, keeps)
        expected = [[int(retriever.ids[r]) for r in row] for row in rows]
        assert [[hit["id"] for hit in hits] for hits in answer["results"]] == expected, mode
    # with a shortlist that holds every row the cascade is exact search at dim: flat's answer
    whole = load_retriever(ckpt, "test", options=ServeOptions(shortlist=10_000))
    flat = _ask(whole, True, texts=QUERIES, k=k)["results"]
    adaptive = _ask(whole, True, texts=QUERIES, k=k, mode="adaptive")["results"]
    assert [[h["id"] for h in hits] for hits in adaptive] == [[h["id"] for h in hits] for hits in flat]
    np.testing.assert_allclose(
        [[h["score"] for h in hits] for hits in adaptive],
        [[h["score"] for h in hits] for hits in flat],
        atol=1e-6,
    )


def test_embed_returns_the_embedders_vectors_and_prefixes(pairs_run, retriever):
    ckpt, _ = pairs_run
    full = Embedder.from_checkpoint(ckpt).embed_texts(QUERIES)
    answer = _ask(retriever, False, texts=QUERIES)
    assert answer["dim"] == 64
    np.testing.assert_allclose(answer["embeddings"], full, atol=1e-6)
    cut = _ask(retriever, False, texts=QUERIES, dim=16)
    np.testing.assert_allclose(cut["embeddings"], _unit(full[:, :16]), atol=1e-6)
    # requests answered together (one batch) get the answers they get alone
    jobs = [retriever.parse(_body(texts=[t], dim=32), search=False) for t in QUERIES]
    together = retriever.run(jobs)
    alone = [retriever.run([job])[0] for job in jobs]
    for a, b in zip(together, alone, strict=False):
        np.testing.assert_allclose(a["embeddings"], b["embeddings"], atol=1e-6)


def test_features_are_embedded_as_the_embedder_embeds_them(pairs_run, retriever, tiny_dataset):
    ckpt, _ = pairs_run
    table = pq.read_table(sorted((tiny_dataset / "test").glob("*.parquet")))
    features = np.stack(table.column("image").to_numpy(zero_copy_only=False)[:3]).astype(np.float64)
    answer = _ask(retriever, False, features=features.tolist())
    np.testing.assert_allclose(
        answer["embeddings"], Embedder.from_checkpoint(ckpt).embed_features(features), atol=1e-6
    )


def test_images_arrive_as_base64_and_embed_as_the_embedder_embeds_them(shapes_ckpt):  # noqa: F811
    ckpt, data = shapes_ckpt
    images = pq.read_table(sorted((data / "test").glob("*.parquet"))).column("image").to_pylist()[:4]
    served = load_retriever(ckpt, "test")
    answer = _ask(served, False, images=[base64.b64encode(b).decode() for b in images])
    np.testing.assert_allclose(
        answer["embeddings"], Embedder.from_checkpoint(ckpt).embed_images(images), atol=1e-6
    )
    hits = _ask(served, True, images=[base64.b64encode(images[0]).decode()], k=3)["results"][0]
    assert len(hits) == 3 and hits[0]["score"] == pytest.approx(1.0, abs=1e-5)  # the image finds itself first
    with pytest.raises(RequestError) as e:
        served.parse(_body(images=[base64.b64encode(images[0]).decode(), "bm90IGFuIGltYWdl"]), search=False)
    assert (e.value.status, e.value.field) == (
        422,
        "images.1",
    ) and "not a decodable PNG/JPEG" in e.value.message
    with pytest.raises(RequestError) as e:
        served.parse(_body(images=["%%%"]), search=False)
    assert (e.value.status, e.value.field) == (422, "images.0") and "base64" in e.value.message


# (body, search?, status, field): every refusal `raydist serve` answers with a 4xx naming the field
BAD_REQUESTS = [
    (b"{not json", True, 400, "body"),
    (b"[1, 2]", True, 422, "body"),
    (_body(texts=["a"], colour="red"), True, 422, "colour"),
    (_body(texts=[]), True, 422, "texts"),
    (_body(texts=["a"] * 9), False, 422, "texts"),  # max_items=8
    (_body(texts=["a"], features=[[0.0]]), True, 422, "texts/features"),
    (_body(k=3), True, 422, "texts"),
    (_body(texts=["a"], k=0), True, 422, "k"),
    (_body(texts=["a"], k=10_000), True, 422, "k"),
    (_body(texts=["a"], k="3"), True, 422, "k"),
    (_body(texts=["a"], dim=20), False, 422, "dim"),
    (_body(texts=["a"], dim=20), True, 422, "dim"),
    (_body(texts=["a"], mode="fast"), True, 422, "mode"),
    (_body(texts=[3]), True, 422, "texts.0"),
    (_body(features=[[0.0, 1.0]]), False, 422, "features"),
    (_body(features=[[0.0] * 32, [0.0] * 31]), False, 422, "features"),  # ragged
    (b'{"features": [[NaN' + b", 0.0" * 31 + b"]]}", False, 422, "features"),
    (_body(images=["aGVsbG8="]), False, 422, "images"),  # a feature-vector model takes no images
    (b"x" * 2000, True, 413, "body"),
]


@pytest.fixture(scope="module")
def strict(pairs_run):
    """The index folder served with small limits: 8 items, 1000 bytes."""
    ckpt, index = pairs_run
    return load_retriever(ckpt, str(index), options=ServeOptions(max_items=8, max_body_bytes=1000))


@pytest.mark.parametrize("body, search, status, field", BAD_REQUESTS)
def test_bad_requests_are_refused_with_the_field_named(strict, body, search, status, field):
    with pytest.raises(RequestError) as e:
        strict.parse(body, search=search)
    assert (e.value.status, e.value.field) == (status, field)
    assert e.value.payload() == {"error": f"{field}: {e.value.message}", "field": field}


def test_an_unknown_field_is_refused_with_the_fields_the_route_accepts(strict):
    for search, accepted in (
        (True, "texts, images, features, dim, k, mode"),
        (False, "texts, images, features, dim"),
    ):
        with pytest.raises(RequestError) as e:
            strict.parse(_body(vectors=[[0.0] * 32]), search=search)
        assert (e.value.status, e.value.field) == (422, "vectors")
        assert e.value.message == f"unknown field; accepted: {accepted}"
        route = SearchRequest if search else EmbedRequest  # every field the route's model declares
        assert accepted.split(", ") == list(route.model_json_schema()["properties"])


def test_mode_needs_a_smaller_indexed_dim_and_labels_models_take_no_texts(labels_dataset, tmp_path):
    ckpt = _checkpoint(tmp_path / "run" / "checkpoint_00000001", labels_dataset)
    served = load_retriever(ckpt, "test")  # no nesting: raydist index's dims, 8, 16, 32 and the full 64
    assert sorted(served.indexes) == served.dims == [8, 16, 32, 64]
    with pytest.raises(RequestError) as e:
        served.parse(_body(features=[[0.0] * 32], mode="funnel", dim=8), search=True)
    assert e.value.field == "mode" and "index dim below dim=8" in e.value.message
    with pytest.raises(RequestError) as e:
        served.parse(_body(texts=["a"]), search=True)
    assert e.value.field == "texts" and "no text side" in e.value.message
    answer = _ask(served, True, features=[[0.5] * 32], k=4)["results"][0]
    assert len(answer) == 4 and [h["score"] for h in answer] == sorted(
        (h["score"] for h in answer), reverse=True
    )


def test_serving_options_name_the_flag_of_a_bad_value():
    with pytest.raises(ValueError, match=r"--max-items \(max_items=0\): expected at least 1"):
        ServeOptions(max_items=0)
    with pytest.raises(ValueError, match=r"--batch-wait-ms"):
        ServeOptions(batch_wait_s=-1)


def test_a_run_on_object_storage_serves_as_its_local_copy(s3_server, pairs_run, retriever):
    ckpt, index = pairs_run
    uri = upload(ckpt.parent, s3_server.create_bucket("served-runs") + "/run")
    remote = load_retriever(uri, str(index), options=ServeOptions(max_items=8, shortlist=24))
    for mode in ("flat", "funnel"):
        assert _ask(remote, True, texts=QUERIES, k=5, mode=mode) == _ask(
            retriever, True, texts=QUERIES, k=5, mode=mode
        )
