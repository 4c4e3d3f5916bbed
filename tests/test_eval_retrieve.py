"""Retrieval on trained checkpoints (raydist.eval.retrieve) against independent computations: VSE++ metrics
of raydist.eval.evaluate, brute-force numpy label metrics, flat search for degenerate cascades, the
library funnel, and indexes written to disk; the report's table and figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from raydist.config import load_config
from raydist.eval.adaptive import funnel_retrieval, mflops_per_query
from raydist.eval.metrics import retrieval_metrics
from raydist.eval.retrieve import (
    cascade_ids,
    default_dims,
    drop_self,
    evaluate_adaptive,
    evaluate_cascades,
    evaluate_dims,
    format_table,
    interpolated_dims,
    search_ids,
)
from raydist.retrieval.index import build_index, build_indexes, load_indexes
from raydist.retrieval.search import Cascade, default_funnel
from raydist.retrieval.trained import checkpoint_retrieval_report, evaluate_checkpoint, load_trained
from raydist.tasks import DataInfo, build_task
from raydist.train.local import LocalRuntime
from raydist.train.loop import run_loop
from raydist.train.plan import step_plan

PAIRS_KEYS = [f"{d}_r{k}" for d in ("t2i", "i2t") for k in (1, 5, 10)] + ["rsum"]


def _train(data_dir, run_dir, **overrides):
    """A checkpoint after a few steps of the loop in this process (no Ray)."""
    cfg = load_config(
        "tiny",
        overrides={
            "data.path": str(data_dir),
            "train.num_workers": 1,
            "train.epochs": 1,
            "train.batch_size": 128,
            "train.log_every": 1000,
            **overrides,
        },
    )
    task = build_task(cfg, DataInfo.from_dataset(data_dir))
    plan = step_plan(cfg, task.info.task)
    runtime = LocalRuntime(cfg, task, plan, run_dir)
    run_loop(cfg, task, runtime, plan)
    return runtime.checkpoints[-1]


@pytest.fixture(scope="module")
def pairs_ckpt(tiny_dataset, tmp_path_factory):
    return _train(tiny_dataset, tmp_path_factory.mktemp("pairs_run"))


@pytest.fixture(scope="module")
def labels_ckpt(labels_dataset, tmp_path_factory):
    return _train(
        labels_dataset, tmp_path_factory.mktemp("labels_run"), **{"train.epochs": 2, "train.lr": 0.01}
    )


@pytest.fixture(scope="module")
def pairs_set(pairs_ckpt, tiny_dataset):
    return load_trained(pairs_ckpt, tiny_dataset).embed("test")


@pytest.fixture(scope="module")
def labels_set(labels_ckpt, labels_dataset):
    return load_trained(labels_ckpt, labels_dataset).embed("test")


def _unit(x: np.ndarray, m: int) -> np.ndarray:
    p = x[:, :m].astype(np.float64)
    return p / np.linalg.norm(p, axis=1, keepdims=True)


def _assert_same_ranking(rset, got: np.ndarray, want: np.ndarray) -> None:
    """Same ids, except where two rows tie exactly (duplicate captions): then the same scores."""
    q, db = _unit(rset.queries, rset.dim), _unit(rset.database, rset.dim)
    scores = [np.einsum("qd,qkd->qk", q, db[ids]) for ids in (got, want)]
    np.testing.assert_allclose(*scores, rtol=0, atol=1e-6)
    assert (got == want).mean() > 0.99


def test_pairs_metrics_equal_vsepp_evaluation(pairs_ckpt, tiny_dataset, pairs_set):
    """Full dim: R@K from retrieved ids = evaluate_checkpoint (its own model load and ranks); a prefix: =
    retrieval_metrics on the re-normalised prefixes."""
    assert (pairs_set.task, pairs_set.direction) == ("pairs", "t2i")
    assert pairs_set.database.shape == (100, 64) and pairs_set.queries.shape == (500, 64)
    full = evaluate_dims(pairs_set, [pairs_set.dim], interpolate=False)[0]
    want = evaluate_checkpoint(pairs_ckpt, tiny_dataset, "test", folds=1)
    assert want["rsum"] > 20  # trained a little: not every recall is 0
    assert {key: full[key] for key in PAIRS_KEYS} == pytest.approx({key: want[key] for key in PAIRS_KEYS})
    prefix = evaluate_dims(pairs_set, [16], interpolate=False)[0]
    want16 = retrieval_metrics(
        _unit(pairs_set.database, 16), _unit(pairs_set.queries, 16), pairs_set.query_keys
    )
    assert {key: prefix[key] for key in PAIRS_KEYS} == pytest.approx({key: want16[key] for key in PAIRS_KEYS})
    assert full["t2i_mflops"] == 100 * 64 / 1e6 and full["i2t_mflops"] == 500 * 64 / 1e6
    assert full["t2i_ms_per_query"] > 0 and full["i2t_ms_per_query"] > 0


def test_labels_metrics_equal_brute_force(labels_set):
    """nn1, P@k, mAP@k at every dim = a leave-one-out float64 numpy computation on the prefixes."""
    k = 5
    labels = labels_set.query_keys
    assert labels_set.exclude_self and labels_set.database.shape == (300, 64)
    rows = evaluate_dims(labels_set, [8, 64], k=k, interpolate=False)
    for row in rows:
        x = _unit(labels_set.database, row["dim"])
        scores = x @ x.T
        np.fill_diagonal(scores, -np.inf)
        rel = labels[np.argsort(-scores, axis=1)[:, :k]] == labels[:, None]
        precision_at_r = np.cumsum(rel, axis=1) / np.arange(1, k + 1)
        assert row["nn1"] == pytest.approx(100 * rel[:, 0].mean())
        assert row["p5"] == pytest.approx(100 * rel.mean())
        assert row["map5"] == pytest.approx(100 * ((rel * precision_at_r).sum(axis=1) / k).mean())
    assert rows[-1]["nn1"] > 20  # 10 classes: chance 10 %
    ids = search_ids(build_index(labels_set.database), labels_set.queries, k, exclude_self=True)
    assert not (ids == np.arange(len(ids))[:, None]).any()


@pytest.mark.parametrize("which", ["pairs_set", "labels_set"])
def test_adaptive_at_full_dim_equals_flat(which, request):
    rset = request.getfixturevalue(which)
    d = rset.dim
    for direction in rset.directions():
        flat = search_ids(build_index(direction.database), direction.queries, 10, direction.exclude_self)
        _assert_same_ranking(direction, cascade_ids(direction, Cascade((d, d), (200,)), 10), flat)
    single = evaluate_dims(rset, [d], interpolate=False)[0]
    adaptive = evaluate_adaptive(rset, [(d, d)], shortlist=200)[0]
    metrics = [
        key
        for key in single
        if key not in ("method", "interpolated") and "_per_query" not in key and "mflops" not in key
    ]
    assert {key: adaptive[key] for key in metrics} == {key: single[key] for key in metrics}
    n = len(rset.database)
    assert adaptive[f"{rset.prefix}mflops"] == pytest.approx(mflops_per_query(n, d, [(min(200, n), d)]))


def test_cascades_equal_library_funnel(pairs_set):
    """Cascades over a prebuilt shortlist index = raydist.eval.adaptive.funnel_retrieval (its own index)."""
    for cascade in (Cascade((8, 64), (50,)), Cascade((8, 16, 32, 64), (80, 40, 20))):
        for direction in pairs_set.directions():
            _, want = funnel_retrieval(
                direction.database,
                direction.queries,
                dims=list(cascade.dims),
                shortlists=list(cascade.shortlists),
                k=10,
            )
            np.testing.assert_array_equal(cascade_ids(direction, cascade, 10), want)
    row = evaluate_cascades(pairs_set, [Cascade((8, 16, 64), (200, 50))])[0]
    assert (row["method"], row["cascade"], row["shortlists"]) == ("funnel", "8>16>64", "200>50")
    assert row["i2t_mflops"] == pytest.approx((500 * 8 + 200 * 16 + 50 * 64) / 1e6)
    assert row["t2i_mflops"] == pytest.approx((100 * 8 + 100 * 16 + 50 * 64) / 1e6)  # shortlist cut to N


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_indexes_written_to_disk_load_back_identical(labels_set, tmp_path, kind):
    dims = [8, 32, 64]
    built = build_indexes(labels_set, dims, kind, out_dir=tmp_path, hnsw_m=16)
    loaded, meta = load_indexes(tmp_path)
    assert sorted(loaded) == dims and meta["kind"] == kind and meta["dims"] == dims
    assert meta["checkpoint"] == labels_set.source and meta["index_options"] == {"hnsw_m": 16}
    np.testing.assert_array_equal(meta["database_ids"], labels_set.database_ids)
    for d in dims:
        want = built[d].search(labels_set.queries[:, :d], 12)
        got = loaded[d].search(labels_set.queries[:, :d], 12)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])
    with pytest.raises(ValueError, match="cannot be written"):
        build_indexes(labels_set, dims, "ivf-prefix", out_dir=tmp_path / "ivf")


def test_report_writes_table_and_figures(pairs_ckpt, labels_ckpt, tiny_dataset, labels_dataset, tmp_path):
    out = checkpoint_retrieval_report(
        pairs_ckpt, tiny_dataset, baseline_checkpoint=pairs_ckpt, out_dir=tmp_path / "pairs"
    )
    assert out["dims"] == [8, 16, 32, 64]
    rows = out["rows"]
    assert {row["method"] for row in rows} == {"single", "adaptive", "funnel", "first-m", "svd", "jl"}
    assert [row["dim"] for row in rows if row.get("interpolated")] == [11, 23, 45]
    assert [row["cascade"] for row in rows if row["method"] == "funnel"] == ["8>16>32>64"]
    by = {(row["method"], row["dim"]): row for row in rows if row["method"] != "adaptive"}
    for key in PAIRS_KEYS:  # the baseline is the same model: first-m = single-shot, SVD to D = a rotation
        assert by["first-m", 64][key] == by["single", 64][key]
        assert by["svd", 64][key] == pytest.approx(by["single", 64][key])
    table = Path(out["files"]["retrieval.txt"]).read_text()
    assert table == out["table"] + "\n" and "8>16>32>64" in table and "45*" in table
    assert json.loads(Path(out["files"]["retrieval.json"]).read_text()) == rows
    for name in ("metric_vs_dim.png", "metric_vs_mflops.png"):
        assert Path(out["files"][name]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    labels = checkpoint_retrieval_report(
        labels_ckpt,
        labels_dataset,
        dims=[16, 64],
        out_dir=tmp_path / "labels",
        funnel=([16, 32, 64], [100, 30]),
    )
    assert [(row["method"], row["dim"]) for row in labels["rows"]] == [
        ("single", 16),
        ("single", 32),
        ("single", 64),
        ("adaptive", 64),
        ("funnel", 64),
    ]
    assert all(row["map10"] >= 0 and row["mflops"] > 0 for row in labels["rows"])
    assert Path(labels["files"]["metric_vs_mflops.png"]).read_bytes()[:4] == b"\x89PNG"


def test_dims_helpers_and_table():
    assert default_dims(64) == [8, 16, 32, 64] and default_dims(100) == [8, 16, 32, 64, 100]
    assert default_dims(6) == [6]
    assert interpolated_dims([8, 16, 32, 33]) == [11, 23]
    assert default_funnel([8, 16, 32, 64, 128], 256) == Cascade((8, 16, 32, 64, 256), (200, 100, 50, 25))
    np.testing.assert_array_equal(drop_self(np.array([[0, 3, 1], [2, 1, 0]]), 2), [[3, 1], [2, 0]])
    with pytest.raises(ValueError, match="non-increasing"):
        Cascade((8, 16, 64), (50, 100))
    table = format_table(
        [
            {"method": "single", "dim": 11, "interpolated": True, "nn1": 50.0, "mflops": 0.5},
            {"method": "funnel", "dim": 64, "cascade": "8>64", "nn1": 60.25},
        ]
    )
    lines = table.splitlines()
    assert lines[0].split() == ["method", "dim", "cascade", "nn1", "mflops"]
    assert lines[1].split() == ["single", "11*", "-", "50.0", "0.5"] and lines[2].split()[-1] == "-"


def test_faiss_and_matplotlib_are_imported_lazily():
    code = (
        "import sys, raydist.eval.retrieve, raydist.eval.retrieval_plots; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'faiss', 'matplotlib'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
