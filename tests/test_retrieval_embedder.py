"""raydist.Embedder (a trained model for new texts and feature vectors) against evaluation's own embedding of a
split (Task.embed) and the training data path (Task.transform + Task.encode); ``raydist search`` against a
brute-force numpy search over the embedded rows; indexes over one split or the whole dataset."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import raydist
from raydist.checkpoint import TASK_FILE, save_checkpoint
from raydist.cli import main
from raydist.config import ConfigError, load_config
from raydist.dataset_task import dataset_task
from raydist.retrieval.embedder import Embedder
from raydist.retrieval.query import search_index
from raydist.retrieval.trained import load_trained, write_checkpoint_indexes
from raydist.tasks import DataInfo, build_task
from raydist.tasks.base import to_tensors

SPLITS = ("train", "val", "test")


def _checkpoint(folder: Path, data_dir: Path, **overrides) -> Path:
    """A checkpoint of a freshly built (seeded) model: the vectors only have to be the model's."""
    cfg = load_config(
        "tiny",
        overrides={"data.path": str(data_dir), "train.num_workers": 0, **overrides},
        task_of=dataset_task,
    )
    info = DataInfo.from_dataset(data_dir)
    torch.manual_seed(0)
    model = build_task(cfg, info).build_model()
    return save_checkpoint(folder, {"model": model.state_dict()}, cfg, task=info.to_json(), files=info.files)


@pytest.fixture(scope="module")
def pairs_ckpt(tiny_dataset, tmp_path_factory) -> Path:
    return _checkpoint(
        tmp_path_factory.mktemp("pairs") / "run" / "checkpoint_00000001",
        tiny_dataset,
        **{"model.nesting": [16, 64]},
    )


@pytest.fixture(scope="module")
def labels_ckpt(labels_dataset, tmp_path_factory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("labels") / "checkpoint_00000001", labels_dataset)


def _split(data_dir: Path, split: str) -> dict[str, np.ndarray]:
    """A split's columns read straight from its Parquet shards (not through raydist's readers)."""
    table = pq.read_table(sorted((data_dir / split).glob("*.parquet")))
    cols = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
    cols["image"] = np.stack(cols["image"]).astype(np.float32)
    return cols


def _first_rows(image_ids: np.ndarray) -> np.ndarray:
    """The row of each image's first caption, images in first-appearance order."""
    seen: dict[int, int] = {}
    for row, image_id in enumerate(image_ids.tolist()):
        seen.setdefault(image_id, row)
    return np.array(list(seen.values()))


def _unit(x: np.ndarray, m: int) -> np.ndarray:
    p = x[:, :m].astype(np.float64)
    return p / np.linalg.norm(p, axis=1, keepdims=True)


def test_pairs_embedder_equals_evaluation_and_the_training_data_path(pairs_ckpt, tiny_dataset):
    run = pairs_ckpt.parent
    embedder = raydist.Embedder.from_checkpoint(run)  # a run folder: its (only) checkpoint
    assert raydist.Embedder is Embedder and embedder.checkpoint.path == pairs_ckpt
    rset = load_trained(pairs_ckpt).embed("test")
    cols = _split(tiny_dataset, "test")
    captions = [str(c) for c in cols["caption"]]
    texts = embedder.embed_texts(captions)
    images = embedder.embed_features(cols["image"][_first_rows(cols["image_id"])])
    assert texts.dtype == np.float32 and texts.shape == rset.queries.shape
    np.testing.assert_allclose(texts, rset.queries, atol=1e-5)
    np.testing.assert_allclose(images, rset.database, atol=1e-5)
    # the training path: the task's transform (tokens padded to max_caption_len) and encode
    trained = embedder.trained
    batch = trained.task.transform({k: cols[k][:40] for k in ("image_id", "sample_id", "image", "caption")})
    with torch.no_grad():
        encoded = trained.task.encode(trained.model, to_tensors(batch, "cpu"))
    np.testing.assert_allclose(texts[:40], encoded.embeddings["cap"].numpy(), atol=1e-5)
    np.testing.assert_allclose(
        embedder.embed_features(cols["image"][:40]), encoded.embeddings["img"].numpy(), atol=1e-5
    )
    # texts and features in one space: a caption's score with its image is the evaluation's score
    np.testing.assert_allclose(
        (texts * images[rset.query_keys]).sum(1),
        (rset.queries * rset.database[rset.query_keys]).sum(1),
        atol=1e-5,
    )


def test_a_matryoshka_dim_is_the_renormalised_prefix(pairs_ckpt, tiny_dataset):
    cols = _split(tiny_dataset, "val")
    full = Embedder.from_checkpoint(pairs_ckpt)
    cut = Embedder.from_checkpoint(pairs_ckpt, dim=16)
    captions = [str(c) for c in cols["caption"][:50]]
    got = cut.embed_texts(captions)
    assert got.shape == (50, 16)
    np.testing.assert_allclose(got, _unit(full.embed_texts(captions), 16), atol=1e-6)
    np.testing.assert_allclose(
        cut.embed_features(cols["image"][:7]), _unit(full.embed_features(cols["image"][:7]), 16), atol=1e-6
    )
    with pytest.raises(ValueError, match=r"dim=65: expected 1 <= dim <= 64"):
        Embedder.from_checkpoint(pairs_ckpt, dim=65)


def test_labels_embedder_equals_evaluation(labels_ckpt, labels_dataset):
    embedder = Embedder.from_checkpoint(labels_ckpt)
    rset = load_trained(labels_ckpt).embed("val")
    got = embedder.embed_features(_split(labels_dataset, "val")["image"])
    np.testing.assert_allclose(got, rset.database, atol=1e-5)
    with pytest.raises(ValueError, match="task 'labels' has no text side"):
        embedder.embed_texts(["a caption"])
    with pytest.raises(ValueError, match=r"expected an array of shape \[N >= 1, 32\].*got \(3, 16\)"):
        embedder.embed_features(np.zeros((3, 16)))
    with pytest.raises(TypeError, match="list of strings"):
        embedder.embed_texts("one text")


def test_the_embedder_needs_no_dataset_but_evaluation_does(pairs_ckpt, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(pairs_ckpt, moved)
    info = json.loads((moved / TASK_FILE).read_text())
    (moved / TASK_FILE).write_text(json.dumps({**info, "data_dir": str(tmp_path / "gone")}))
    texts = ["a small test caption", "another one"]
    np.testing.assert_allclose(
        Embedder.from_checkpoint(moved).embed_texts(texts),
        Embedder.from_checkpoint(pairs_ckpt).embed_texts(texts),
        atol=1e-6,
    )
    with pytest.raises(ConfigError, match="records no dataset that still exists"):
        load_trained(moved)


def _result_lines(out: str) -> list[list[str]]:
    """The ``RANK id ID score SCORE`` lines of ``raydist search``, split into words."""
    return [words for words in (line.split() for line in out.splitlines()) if words[1:2] == ["id"]]


def _brute_force(queries: np.ndarray, database: np.ndarray, ids: np.ndarray, dim: int, k: int):
    scores = _unit(queries, dim) @ _unit(database, dim).T
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return ids[top], np.take_along_axis(scores, top, 1)


@pytest.mark.parametrize("dim", [16, 64])
def test_search_of_an_index_over_the_whole_dataset_equals_brute_force(
    pairs_ckpt, tiny_dataset, tmp_path, dim
):
    out = tmp_path / "index"
    rset, dims = write_checkpoint_indexes(pairs_ckpt, out, split="all", dims=[16, 64])
    assert dims == [16, 64] and rset.split == "train+val+test"
    trained = load_trained(pairs_ckpt)
    parts = [trained.task.embed(trained.model, s) for s in SPLITS]
    database = np.concatenate([p.database for p in parts])
    ids = np.concatenate([p.database_ids for p in parts])
    columns = [_split(tiny_dataset, s) for s in SPLITS]
    assert len(database) == sum(len(np.unique(c["image_id"])) for c in columns)
    np.testing.assert_array_equal(np.load(out / "database_ids.npy"), ids)
    captions = [str(c) for c in columns[0]["caption"][:6]] + ["an unseen caption with zzzunknown words"]
    result = search_index(out, captions, k=7, dim=dim)
    want_ids, want_scores = _brute_force(
        Embedder.from_checkpoint(pairs_ckpt).embed_texts(captions), database, ids, dim, 7
    )
    np.testing.assert_array_equal(result.ids, want_ids)
    np.testing.assert_allclose(result.scores, want_scores, atol=1e-5)
    assert result.dim == dim and result.checkpoint.path == pairs_ckpt


@pytest.mark.parametrize("mode", ["adaptive", "funnel"])
def test_a_cascade_search_of_an_index_folder_equals_a_brute_force_shortlist_and_rerank(
    pairs_ckpt, tiny_dataset, tmp_path, mode
):
    """Two index dims: adaptive and funnel both shortlist at 16 and re-rank the list at 64."""
    out = tmp_path / "index"
    rset, _ = write_checkpoint_indexes(pairs_ckpt, out, split="test", dims=[16, 64])
    captions = [str(c) for c in _split(tiny_dataset, "test")["caption"][:5]]
    shortlist, k = 8, 4
    result = search_index(out, captions, k=k, mode=mode, shortlist=shortlist)
    queries = Embedder.from_checkpoint(pairs_ckpt).embed_texts(captions)
    for q, query in enumerate(queries):
        short = np.argsort(-(_unit(rset.database, 16) @ _unit(query[None], 16)[0]), kind="stable")[:shortlist]
        scores = _unit(rset.database[short], 64) @ _unit(query[None], 64)[0]
        order = np.argsort(-scores, kind="stable")[:k]
        np.testing.assert_array_equal(result.ids[q], rset.database_ids[short[order]])
        np.testing.assert_allclose(result.scores[q], scores[order], atol=1e-5)


def test_search_command_prints_the_ids_and_scores(
    pairs_ckpt, labels_ckpt, tiny_dataset, labels_dataset, tmp_path, capsys
):
    out = tmp_path / "index"
    assert (
        main(
            [
                "index",
                "--checkpoint",
                str(pairs_ckpt.parent),
                "--split",
                "val",
                "--dims",
                "64",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    capsys.readouterr()
    queries = tmp_path / "queries.txt"
    captions = [str(c) for c in _split(tiny_dataset, "val")["caption"][:2]]
    queries.write_text("\n".join(captions) + "\n\n")
    for args in (["--query", captions[0]], ["--queries", str(queries)]):
        assert main(["search", "--index", str(out), *args, "--k", "3"]) == 0
        printed = _result_lines(capsys.readouterr().out)
        want = search_index(out, captions[: len(printed) // 3], k=3)
        assert [int(p[2]) for p in printed] == want.ids.ravel().tolist()
        np.testing.assert_allclose([float(p[4]) for p in printed], want.scores.ravel(), atol=1e-4)
    # labels: feature-vector queries from a .npy file, against brute force over the indexed split
    labels_out = tmp_path / "labels_index"
    rset, _ = write_checkpoint_indexes(labels_ckpt, labels_out, split="test")
    vectors = _split(labels_dataset, "val")["image"][:4]
    np.save(tmp_path / "q.npy", vectors)
    assert main(["search", "--index", str(labels_out), "--queries", str(tmp_path / "q.npy"), "--k", "5"]) == 0
    printed = _result_lines(capsys.readouterr().out)
    want_ids, _ = _brute_force(
        Embedder.from_checkpoint(labels_ckpt).embed_features(vectors),
        rset.database,
        rset.database_ids,
        rset.dim,
        5,
    )
    assert [int(p[2]) for p in printed] == want_ids.ravel().tolist()
    assert main(["search", "--index", str(labels_out), "--query", "text"]) == 2
    assert "has no text side" in capsys.readouterr().err
    assert main(["search", "--index", str(tmp_path / "nowhere"), "--query", "x"]) == 2
    assert "no indexes.json" in capsys.readouterr().err
    assert main(["search", "--index", str(out)]) == 2
    assert "give one of --query TEXT or --queries FILE" in capsys.readouterr().err


def test_importing_raydist_does_not_import_torch():
    code = "import sys, raydist; print('torch' in sys.modules, raydist.__version__ != '')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]


def test_the_embedder_standardises_raw_vectors_with_the_train_statistics(tmp_path):
    """A dataset converted with ``--standardize``: the embedder takes vectors as the source .npz holds them and
    applies the train split's mean and std (numpy, float64, here) before the model, as every split was."""
    from raydist.converters.npz import convert_npz

    rng = np.random.default_rng(0)
    n, dim = 120, 6
    x = rng.normal(size=(n, dim)) * np.array([1e-3, 1.0, 10.0, 1e3, 5.0, 0.1]) + 50.0
    y = rng.integers(0, 3, size=n)
    split = np.array(["train"] * 80 + ["val"] * 20 + ["test"] * 20)
    np.savez(tmp_path / "raw.npz", X=x, y=y, split=split)
    data = convert_npz(tmp_path / "raw.npz", tmp_path / "data", standardize=True)
    ckpt = _checkpoint(tmp_path / "checkpoint_00000001", data)
    train = x[:80]
    expected_in = ((x[100:] - train.mean(0)) / train.std(0)).astype(np.float32)
    trained = load_trained(ckpt)
    want = trained.task.embed_features(trained.model, expected_in).numpy()
    got = Embedder.from_checkpoint(ckpt).embed_features(x[100:])
    np.testing.assert_allclose(got, want, atol=1e-5)
    raw = trained.task.embed_features(trained.model, x[100:].astype(np.float32)).numpy()
    assert np.abs(got - raw).max() > 1e-2  # the statistics were applied (raw vectors embed elsewhere)
