"""Validation: one test per kind of bad input; each problem must name its file, field and (where there
is one) row, and read_split(verify=True) must refuse the same dataset."""

from __future__ import annotations

import hashlib
import json
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raydist.data import (
    DatasetWriter,
    RaydistDataError,
    check_split_size,
    make_synthetic,
    read_split,
    validate_dataset,
)

SHARD0, SHARD1 = "train/part-00000.parquet", "train/part-00001.parquet"


@pytest.fixture
def ds(tmp_path):
    """Tiny valid dataset: train = 8 images x 2 captions in shards of 6, 6, 4 rows; dim 4."""
    return make_synthetic(
        tmp_path / "ds", images=8, val_images=4, test_images=4, dim=4, captions_per_image=2, rows_per_shard=6
    )


def _manifest(ds):
    return json.loads((ds / "manifest.json").read_text())


def _save_manifest(ds, raw):
    (ds / "manifest.json").write_text(json.dumps(raw))


def _rewrite(ds, file, table, *, update_rows=True):
    """Replace a shard and re-register its sha256 (and row count) so only the planted defect remains."""
    pq.write_table(table, ds / file)
    raw = _manifest(ds)
    for split in raw["splits"].values():
        for shard in split["shards"]:
            if shard["file"] == file:
                shard["sha256"] = hashlib.sha256((ds / file).read_bytes()).hexdigest()
                if update_rows:
                    shard["rows"] = table.num_rows
    _save_manifest(ds, raw)


def _set(table, name, values, typ=None):
    i = table.schema.get_field_index(name)
    return table.set_column(i, name, pa.array(values, typ or table.schema.field(name).type))


def _expect(ds, file, field, message, row=None, split="train"):
    """validate_dataset lists a matching problem, and read_split(verify=True) raises naming file/field."""
    report = validate_dataset(ds)
    hits = [
        p
        for p in report.problems
        if p.file == file and p.field == field and p.row == row and re.search(message, p.message)
    ]
    assert hits, report.format()
    assert not report.ok and "problem(s)" in report.format()
    with pytest.raises(RaydistDataError, match="problem"):
        report.raise_if_problems()
    if split is not None:
        with pytest.raises(RaydistDataError) as err:
            read_split(ds, split, verify=True)
        text = str(err.value)
        assert file in text and (field is None or f"'{field}'" in text), text
        if row is not None:
            assert f"row {row}" in text


def test_valid_dataset_has_no_problems(ds):
    report = validate_dataset(ds, min_rows={"train": 16})
    assert report.ok, report.format()
    assert report.splits["train"].rows == 16 and report.splits["train"].images == 8
    assert report.vocab_size > 4 and report.feature_dim == 4
    assert "OK" in report.format()


def test_missing_manifest(tmp_path):
    _expect(tmp_path, "manifest.json", None, "missing", split=None)
    with pytest.raises(RaydistDataError, match="manifest.json: missing"):
        read_split(tmp_path, "train")


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("format_version", 2, "field 'format_version': unknown version 2"),
        ("task", "Not A Task", "field 'task': expected a task name"),
        ("feature_dim", "4", "field 'feature_dim': expected an integer, got '4'"),
    ],
)
def test_manifest_bad_field(ds, key, value, message):
    raw = _manifest(ds)
    raw[key] = value
    _save_manifest(ds, raw)
    _expect(ds, "manifest.json", None, re.escape(message), split=None)
    with pytest.raises(RaydistDataError, match=re.escape(message)):
        read_split(ds, "train")


def test_unknown_task_is_refused_above_the_data_layer(labels_dataset, tmp_path):
    """The data layer checks a task name's form only; which names exist is the tasks layer's to say: the
    CLI's and the trainer's validation pass the registered names, and building the task refuses it too."""
    from raydist.config import Config
    from raydist.tasks import DataInfo, build_task, task_names

    ds = tmp_path / "ds"
    shutil.copytree(labels_dataset, ds)
    raw = _manifest(ds)
    raw["task"] = "triplets"  # a labelled-layout dataset of a task no one registered
    _save_manifest(ds, raw)
    assert validate_dataset(ds).ok
    report = validate_dataset(ds, tasks=task_names())
    assert [str(p) for p in report.problems] == [
        f"manifest.json: field 'task': unknown task 'triplets'; expected one of {task_names()}"
    ]
    assert {"labels", "pairs"} <= set(task_names())
    with pytest.raises(
        RaydistDataError, match=re.escape("manifest.json: field 'task': unknown task 'triplets'")
    ):
        build_task(Config(), DataInfo.from_dataset(ds))


def test_manifest_bad_json(ds):
    (ds / "manifest.json").write_text('{"format_version": 1,')
    _expect(ds, "manifest.json", None, "^not valid JSON", split=None)
    with pytest.raises(RaydistDataError, match="manifest.json: not valid JSON"):
        read_split(ds, "train")


def test_shard_listed_but_missing(ds):
    (ds / SHARD1).unlink()
    _expect(ds, SHARD1, "file", "listed in manifest.json is missing")


def test_sha256_mismatch(ds):
    raw = _manifest(ds)
    raw["splits"]["train"]["shards"][1]["sha256"] = "0" * 64
    _save_manifest(ds, raw)
    _expect(ds, SHARD1, "sha256", "expects 0000")


@pytest.mark.parametrize("content", ["truncated", "text"])
def test_file_truncated_or_not_parquet(ds, content):
    data = (ds / SHARD1).read_bytes()
    (ds / SHARD1).write_bytes(
        data[: len(data) // 2] if content == "truncated" else b"image_id,caption\n1,a\n"
    )
    report = validate_dataset(ds)
    assert any(p.file == SHARD1 and p.field == "sha256" for p in report.problems)
    _expect(ds, SHARD1, None, "not a readable Parquet file")


def test_wrong_column_type(ds):
    table = pq.read_table(ds / SHARD0)
    table = table.set_column(1, "sample_id", table.column("sample_id").cast(pa.int32()))
    _rewrite(ds, SHARD0, table)
    _expect(ds, SHARD0, "sample_id", "expected int64, got int32")


def test_unexpected_and_missing_columns(ds):
    table = pq.read_table(ds / SHARD0).rename_columns(["image_id", "sample_id", "image", "captions"])
    _rewrite(ds, SHARD0, table)
    _expect(ds, SHARD0, "caption", "required column missing")
    _expect(ds, SHARD0, "captions", "unexpected column", split=None)  # read_split stops at the first


def test_feature_dim_differs_from_manifest(ds):
    table = pq.read_table(ds / SHARD1)
    wide = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(6 * 5, np.float32)), 5)
    _rewrite(ds, SHARD1, table.set_column(2, "image", wide))
    _expect(ds, SHARD1, "image", "feature dim 5 differs from the manifest's feature_dim 4")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_features(ds, bad):
    table = pq.read_table(ds / SHARD1)
    feats = np.stack(table.column("image").to_numpy(zero_copy_only=False))
    feats[3, 2] = bad
    sample_id = table.column("sample_id")[3].as_py()
    image = pa.FixedSizeListArray.from_arrays(pa.array(feats.reshape(-1).astype(np.float32)), 4)
    _rewrite(ds, SHARD1, table.set_column(2, "image", image))
    _expect(ds, SHARD1, "image", f"NaN or inf \\(sample_id {sample_id}\\)", row=3)


@pytest.mark.parametrize("text", ["", "  \t "])
def test_empty_caption(ds, text):
    table = pq.read_table(ds / SHARD0)
    captions = table.column("caption").to_pylist()
    captions[1] = text
    _rewrite(ds, SHARD0, _set(table, "caption", captions))
    _expect(ds, SHARD0, "caption", "caption is empty", row=1)


def test_image_with_no_captions(ds):
    table = pq.read_table(ds / SHARD1)
    image_id = table.column("image_id")[2].as_py()
    captions = table.column("caption").to_pylist()
    captions[2] = captions[3] = None
    _rewrite(ds, SHARD1, _set(table, "caption", captions))
    _expect(ds, SHARD1, "caption", f"image_id {image_id} has no captions", row=2)


def test_labels_out_of_range(tmp_path):
    out = tmp_path / "labels"
    with DatasetWriter(out, task="labels", num_classes=3) as writer:
        for i, split in enumerate(("train", "val", "test")):
            ids = np.arange(4) + 10 * i
            writer.add_split(
                split,
                ids,
                ids,
                np.ones((4, 2)),
                labels=np.array([0, 1, 2, 0]),
                clean_labels=np.array([0, 1, 2, 2]),
            )
    assert validate_dataset(out).ok
    file = "val/part-00000.parquet"
    table = pq.read_table(out / file)
    _rewrite(out, file, _set(table, "label", [0, 3, 2, -1]))
    _expect(out, file, "label", r"label outside \[0, 3\) \(sample_id 11\)", row=1, split="val")
    _expect(out, file, "label", r"label outside \[0, 3\) \(sample_id 13\)", row=3, split=None)
    with (
        pytest.raises(RaydistDataError, match="label outside"),
        DatasetWriter(tmp_path / "x", task="labels", num_classes=2) as writer,
    ):
        writer.add_split("train", np.arange(2), np.arange(2), np.ones((2, 2)), labels=np.array([0, 2]))


def test_image_rows_not_consecutive(ds):
    table = pq.read_table(ds / SHARD0)
    table = table.take([0, 2, 1, 3, 4, 5])  # image A, B, A, B, C, C
    image_a = table.column("image_id")[0].as_py()
    _rewrite(ds, SHARD0, table)
    _expect(ds, SHARD0, "image_id", f"image_id {image_a} appears again", row=2)


def test_image_rows_split_across_shards_not_adjacent(ds):
    table = pq.read_table(ds / SHARD1)
    first_image = pq.read_table(ds / SHARD0).column("image_id")[0].as_py()
    ids = table.column("image_id").to_pylist()
    ids[0] = ids[1] = first_image  # image of shard 0 resumes in shard 1 after other images
    _rewrite(ds, SHARD1, _set(table, "image_id", ids))
    _expect(ds, SHARD1, "image_id", f"image_id {first_image} appears again", row=0)


def test_duplicate_sample_id(ds):
    first = pq.read_table(ds / SHARD0).column("sample_id")[0].as_py()
    table = pq.read_table(ds / SHARD1)
    sample_ids = table.column("sample_id").to_pylist()
    sample_ids[4] = first
    _rewrite(ds, SHARD1, _set(table, "sample_id", sample_ids))
    _expect(ds, SHARD1, "sample_id", f"duplicate sample_id {first} \\(first at {SHARD0} row 0\\)", row=4)


def test_image_id_in_two_splits(ds):
    train_image = pq.read_table(ds / SHARD0).column("image_id")[0].as_py()
    file = "test/part-00000.parquet"
    table = pq.read_table(ds / file)
    ids = table.column("image_id").to_pylist()
    ids[0] = ids[1] = train_image
    _rewrite(ds, file, _set(table, "image_id", ids))
    _expect(ds, "manifest.json", "image_id", "appear in both 'train' and 'test'", split=None)


def test_shard_rows_differ_from_manifest(ds):
    table = pq.read_table(ds / SHARD1).slice(0, 5)
    _rewrite(ds, SHARD1, table, update_rows=False)
    _expect(ds, SHARD1, "rows", "file has 5 rows but manifest.json says 6")


def test_split_counts_differ_from_manifest(ds):
    raw = _manifest(ds)
    raw["splits"]["val"]["rows"] = 9
    _save_manifest(ds, raw)
    _expect(ds, "manifest.json", "splits.val.rows", "9 rows but its shards list 8", split="val")
    raw["splits"]["val"]["rows"] = 8
    raw["splits"]["val"]["images"] = 5
    _save_manifest(ds, raw)
    _expect(ds, "manifest.json", "splits.val.images", "says 5 images, the shards hold 4", split="val")


def test_missing_vocab_file(ds):
    (ds / "vocab.json").unlink()
    _expect(ds, "vocab.json", "vocab", "vocab file missing", split=None)


def test_min_rows_and_check_split_size(ds):
    report = validate_dataset(ds, min_rows={"val": 100})
    assert [str(p) for p in report.problems] == [
        "manifest.json: field 'splits.val.rows': split 'val' has 8 rows, fewer than the 100 required"
    ]
    assert check_split_size(ds, "train", 16) == 16
    with pytest.raises(
        RaydistDataError, match=r"split 'train' has 16 rows, fewer than one global batch of 32"
    ):
        check_split_size(ds, "train", 32)


def test_many_bad_rows_are_summarised(ds):
    table = pq.read_table(ds / SHARD0)
    _rewrite(ds, SHARD0, _set(table, "caption", [" "] * 6))
    problems = [p for p in validate_dataset(ds).problems if p.field == "caption"]
    assert [p.row for p in problems] == [0, 1, 2, 3, 4, None, 0, 2, 4]
    assert "1 more rows" in problems[5].message
