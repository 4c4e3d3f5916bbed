"""Indexes against brute-force float64 numpy rankings on seeded random unit vectors."""

import subprocess
import sys

import numpy as np
import pytest

from raydist.retrieval.index import build_index, unit_rows


def unit64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_force(
    db: np.ndarray, queries: np.ndarray, k: int, check_ties: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k by float64 cosine; the seeds are chosen so that the first k+1 ranks of every query
    are at least 1e-5 apart (far above float32 rounding), which ``check_ties`` asserts."""
    scores = unit64(queries) @ unit64(db).T
    order = np.argsort(-scores, axis=1)[:, : k + 1]
    top = np.take_along_axis(scores, order, 1)
    assert not check_ties or np.diff(top, axis=1).max() < -1e-5, "near-tie: choose another seed"
    return top[:, :k], order[:, :k]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    return rng.standard_normal((2000, 32)) * 3.0, rng.standard_normal((50, 32))


def test_importing_the_module_does_not_import_faiss():
    code = "import sys, raydist.retrieval.index; assert 'faiss' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unit_rows():
    x = np.array([[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_array_equal(unit_rows(x), np.array([[0.6, 0.8], [0.0, 0.0]], dtype=np.float32))


def test_flat_equals_brute_force(data):
    db, queries = data
    index = build_index(db, "flat")
    assert (index.kind, index.device, index.ntotal, index.dim) == ("flat", "cpu", 2000, 32)
    scores, ids = index.search(queries, 10)
    true_scores, true_ids = brute_force(db, queries, 10)
    np.testing.assert_array_equal(ids, true_ids)
    np.testing.assert_allclose(scores, true_scores, atol=1e-5)


def test_use_gpu_false_is_cpu(data):
    assert build_index(data[0], "flat", use_gpu=False).device == "cpu"


def test_hnsw_recall_at_10():
    rng = np.random.default_rng(1)
    db, queries = rng.standard_normal((5000, 64)), rng.standard_normal((200, 64))
    _, ids = build_index(db, "hnsw", hnsw_m=32, ef_search=128).search(queries, 10)
    _, true_ids = brute_force(db, queries, 10, check_ties=False)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, true_ids, strict=False)])
    assert recall >= 0.95


def test_ivf_prefix_probing_all_lists_is_exact(data):
    db, queries = data
    index = build_index(db, "ivf-prefix", ivf_lists=16, prefix_dim=8)
    assert index.nprobe == 2
    assert sorted(np.concatenate(index.lists).tolist()) == list(range(2000))
    index.nprobe = 16
    scores, ids = index.search(queries, 10)
    true_scores, true_ids = brute_force(db, queries, 10)
    np.testing.assert_array_equal(ids, true_ids)
    np.testing.assert_allclose(scores, true_scores, atol=1e-5)


def test_ivf_prefix_lists_follow_prefix_clusters():
    """Two well-separated groups in the first 4 dims and noise elsewhere: each group fills its own list,
    and one probe finds exactly the group's own vectors ranked by the full-dim score."""
    rng = np.random.default_rng(2)
    centres = np.zeros((2, 4))
    centres[0, 0], centres[1, 1] = 10.0, 10.0
    db = rng.standard_normal((200, 16))
    db[:, :4] += centres[np.arange(200) % 2]
    index = build_index(db, "ivf-prefix", ivf_lists=2, prefix_dim=4, nprobe=1)
    assert sorted(sorted(lst.tolist()) for lst in index.lists) == [
        list(range(0, 200, 2)),
        list(range(1, 200, 2)),
    ]
    query = db[:1] + 0.1 * rng.standard_normal((1, 16))
    _, ids = index.search(query, 100)
    scores = unit64(query) @ unit64(db[::2]).T
    np.testing.assert_array_equal(ids[0], 2 * np.argsort(-scores[0]))


def test_an_ivf_build_on_few_points_per_list_prints_nothing(capfd):
    """faiss's C++ warns on stderr when k-means gets fewer than 39 points per centroid (it does here with its
    defaults); building the index on those points prints nothing."""
    import faiss

    db = np.random.default_rng(3).standard_normal((64, 8))
    faiss.Kmeans(4, 16, niter=2).train(unit_rows(db[:, :4]))
    assert "WARNING clustering 64 points to 16 centroids" in capfd.readouterr().err
    index = build_index(db, "ivf-prefix", ivf_lists=16, prefix_dim=4)
    assert sum(len(lst) for lst in index.lists) == 64
    assert capfd.readouterr() == ("", "")


def test_missing_results_have_id_minus_one():
    db = np.eye(4)[:3]
    for kind in ("flat", "ivf-prefix"):
        _, ids = build_index(db, kind, ivf_lists=1).search(np.ones((1, 4)), 5)
        assert ids[0, 3:].tolist() == [-1, -1]


def test_invalid_arguments(data):
    db, queries = data
    with pytest.raises(ValueError, match="kind="):
        build_index(db, "ivf")
    with pytest.raises(ValueError, match="prefix_dim"):
        build_index(db, "ivf-prefix", prefix_dim=64)
    with pytest.raises(ValueError, match="queries have dim"):
        build_index(db, "flat").search(queries[:, :8], 5)
