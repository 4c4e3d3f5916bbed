"""``raydist search`` shows what it found (issue #51): each hit's split, an image's captions, a sample's class,
checked against the dataset's Parquet shards read here with pyarrow; ``--json`` for scripts; ids only, said so,
when the indexed dataset is gone."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from raydist.checkpoint import save_checkpoint
from raydist.cli import main
from raydist.config import load_config
from raydist.dataset_task import dataset_task
from raydist.tasks import DataInfo, build_task

SPLITS = ("train", "val", "test")


def _checkpoint(folder: Path, data_dir: Path) -> Path:
    """A checkpoint of a freshly built (seeded) model: the hits only have to be the index's."""
    cfg = load_config(
        "tiny", overrides={"data.path": str(data_dir), "train.num_workers": 0}, task_of=dataset_task
    )
    info = DataInfo.from_dataset(data_dir)
    torch.manual_seed(0)
    model = build_task(cfg, info).build_model()
    return save_checkpoint(folder, {"model": model.state_dict()}, cfg, task=info.to_json(), files=info.files)


def _rows(data_dir: Path, key: str) -> dict[int, dict]:
    """Per id: its split, its captions in row order and its label, straight from the shards."""
    rows: dict[int, dict] = defaultdict(lambda: {"captions": []})
    for split in SPLITS:
        table = pq.read_table(sorted((data_dir / split).glob("*.parquet"))).to_pydict()
        for r, i in enumerate(table[key]):
            rows[i]["split"] = split
            if "caption" in table:
                rows[i]["captions"].append(table["caption"][r])
            if "label" in table:
                rows[i]["label"] = table["label"][r]
    return rows


def _search(capsys, *args: str) -> str:
    capsys.readouterr()
    assert main(["search", *args]) == 0
    return capsys.readouterr().out


@pytest.fixture(scope="module")
def pairs_index(tiny_dataset, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("search-pairs")
    ckpt = _checkpoint(root / "run" / "checkpoint_00000001", tiny_dataset)
    assert main(["index", "--checkpoint", str(ckpt), "--split", "all", "--out", str(root / "index")]) == 0
    return root / "index"


def test_pairs_hits_show_their_images_captions_and_split(pairs_index, tiny_dataset, capsys):
    truth = _rows(tiny_dataset, "image_id")
    query = truth[next(iter(truth))]["captions"][0]
    report = json.loads(_search(capsys, "--index", str(pairs_index), "--query", query, "--k", "4", "--json"))
    assert report["task"] == "pairs" and report["dataset"] == str(tiny_dataset)
    [only] = report["queries"]
    assert only["query"] == query and [h["rank"] for h in only["hits"]] == [1, 2, 3, 4]
    for hit in only["hits"]:
        assert hit["captions"] == truth[hit["id"]]["captions"] and hit["split"] == truth[hit["id"]]["split"]
        assert "label" not in hit
    scores = [h["score"] for h in only["hits"]]
    assert scores == sorted(scores, reverse=True)
    # the text form: the same ids and scores, each line with its split and its first caption
    lines = [
        line
        for line in _search(capsys, "--index", str(pairs_index), "--query", query, "--k", "4").splitlines()
    ]
    hit_lines = [line.split() for line in lines if line.split()[1:2] == ["id"]]
    assert [int(w[2]) for w in hit_lines] == [h["id"] for h in only["hits"]]
    np.testing.assert_allclose([float(w[4]) for w in hit_lines], scores, atol=1e-4)
    for words, hit in zip(hit_lines, only["hits"], strict=True):
        line = " ".join(words)
        assert words[5] == hit["split"] and json.dumps(hit["captions"][0]) in line
        assert f"(+{len(hit['captions']) - 1} more)" in line


def test_labels_hits_show_their_class(labels_dataset, tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "run" / "checkpoint_00000001", labels_dataset)
    assert (
        main(["index", "--checkpoint", str(ckpt), "--split", "test", "--out", str(tmp_path / "index")]) == 0
    )
    vectors = np.stack(
        pq.read_table(sorted((labels_dataset / "val").glob("*.parquet"))).column("image").to_pylist()
    )
    np.save(tmp_path / "q.npy", vectors[:3].astype(np.float32))
    args = ["--index", str(tmp_path / "index"), "--queries", str(tmp_path / "q.npy"), "--k", "5"]
    report = json.loads(_search(capsys, *args, "--json"))
    truth = _rows(labels_dataset, "sample_id")
    assert [q["query"] for q in report["queries"]] == [0, 1, 2]
    for hit in (h for q in report["queries"] for h in q["hits"]):
        assert hit["split"] == "test" and hit["label"] == truth[hit["id"]]["label"]
    printed = [line.split() for line in _search(capsys, *args).splitlines() if line.split()[1:2] == ["id"]]
    first = report["queries"][0]["hits"]
    assert [w[5:7] for w in printed[:5]] == [["test", "class"]] * 5
    assert [int(w[7]) for w in printed[:5]] == [h["label"] for h in first]


def test_ids_only_when_the_dataset_is_gone_and_data_brings_it_back(
    pairs_index, tiny_dataset, tmp_path, capsys
):
    meta = json.loads((pairs_index / "indexes.json").read_text())
    moved = tmp_path / "moved"
    shutil.copytree(tiny_dataset, moved)
    gone = tmp_path / "gone-index"
    shutil.copytree(pairs_index, gone)
    # the index's checkpoint recorded a dataset folder that no longer exists
    ckpt = tmp_path / "ckpt"
    shutil.copytree(meta["checkpoint"], ckpt)
    task = json.loads((ckpt / "task.json").read_text())
    (ckpt / "task.json").write_text(json.dumps({**task, "data_dir": str(tmp_path / "nowhere")}))
    (gone / "indexes.json").write_text(json.dumps({**meta, "checkpoint": str(ckpt)}))
    out = _search(capsys, "--index", str(gone), "--query", "a dog", "--k", "2")
    assert "the indexed dataset is gone; --data DIR shows what they are" in out
    assert all(len(w) == 5 for w in (line.split() for line in out.splitlines()) if w[1:2] == ["id"])
    report = json.loads(_search(capsys, "--index", str(gone), "--query", "a dog", "--k", "2", "--json"))
    assert report["dataset"] is None and all(
        set(h) == {"rank", "id", "score"} for h in report["queries"][0]["hits"]
    )
    report = json.loads(
        _search(capsys, "--index", str(gone), "--query", "a dog", "--k", "2", "--json", "--data", str(moved))
    )
    truth = _rows(moved, "image_id")
    assert all(h["captions"] == truth[h["id"]]["captions"] for h in report["queries"][0]["hits"])


def test_a_hit_line_names_the_class_when_the_dataset_does():
    from raydist.cli.search_results import hit_line

    hit = {"rank": 1, "id": 7, "score": 0.5, "split": "val", "label": 3, "class": "cat"}
    assert hit_line(hit).split()[5:] == ["val", "class", "3", "'cat'"]
    assert hit_line({**hit, "class": "3"}).split()[5:] == [
        "val",
        "class",
        "3",
    ]  # a name that says nothing more
    long = {"rank": 2, "id": 8, "score": 0.25, "captions": ["x" * 200, "y"]}
    assert hit_line(long).endswith('…" (+1 more)') and len(hit_line(long)) < 120
