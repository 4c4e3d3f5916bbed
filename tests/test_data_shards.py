"""Shard writer/reader round trips, manifest hashes and the staged DatasetWriter."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from raydist.data import (
    DatasetWriter,
    RaydistDataError,
    Vocab,
    feature_matrix,
    load_manifest,
    read_split,
    split_arrays,
    split_files,
    write_split,
)


def _arrays(rng: np.random.Generator, images: int, first_id: int, dim: int = 6):
    caps_per = rng.integers(1, 4, images)  # 1-3 captions per image
    image_ids = np.repeat(np.arange(first_id, first_id + images) * 10, caps_per)
    n = len(image_ids)
    sample_ids = np.arange(n) + 1000 * first_id
    features = rng.normal(size=(n, dim)).astype(np.float32)
    captions = [f"caption {k} of image {i} é" for k, i in enumerate(image_ids)]
    return image_ids, sample_ids, features, captions


def _write(tmp_path, rows_per_shard=5, dtype=np.float32):
    rng = np.random.default_rng(0)
    data = {s: _arrays(rng, 7, first) for s, first in (("train", 0), ("val", 100), ("test", 200))}
    out = tmp_path / "ds"
    with DatasetWriter(out, rows_per_shard=rows_per_shard, source={"test": True}) as w:
        w.vocab = Vocab.build(data["train"][3])
        for split, (ids, sids, feats, caps) in data.items():
            w.add_split(split, ids, sids, feats.astype(dtype), caps)
    return out, data


def test_round_trip_equals_input(tmp_path):
    out, data = _write(tmp_path)
    for split, (ids, sids, feats, caps) in data.items():
        got_ids, got_sids, got_feats, got_caps = split_arrays(out, split)
        np.testing.assert_array_equal(got_ids, ids)
        np.testing.assert_array_equal(got_sids, sids)
        np.testing.assert_array_equal(got_feats, feats)
        assert got_feats.dtype == np.float32
        assert got_caps == caps
        table = read_split(out, split)
        assert table.column_names == ["image_id", "sample_id", "image", "caption"]
    manifest = load_manifest(out)
    assert manifest.splits["train"].rows == len(data["train"][0])
    assert manifest.splits["train"].images == 7
    assert manifest.source == {"test": True}


def test_manifest_sha256_and_rows_match_files(tmp_path):
    out, _ = _write(tmp_path)
    raw = json.loads((out / "manifest.json").read_text())
    assert raw["format_version"] == 1 and raw["task"] == "pairs" and raw["feature_dim"] == 6
    assert raw["vocab"] == "vocab.json" and (out / "vocab.json").is_file()
    for split in ("train", "val", "test"):
        shards = raw["splits"][split]["shards"]
        assert len(shards) > 1
        for shard in shards:
            path = out / shard["file"]
            assert shard["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
            assert shard["rows"] == pq.read_metadata(path).num_rows
        assert split_files(out, split) == [str((out / s["file"]).resolve()) for s in shards]


def test_shards_cut_at_image_boundaries(tmp_path):
    out, data = _write(tmp_path, rows_per_shard=2)
    seen = set()
    for path in split_files(out, "train"):
        ids = pq.read_table(path).column("image_id").to_numpy()
        assert len(ids) >= 2 or path == split_files(out, "train")[-1]
        assert not set(ids) & seen  # no image straddles two shards
        seen |= set(ids)
    assert seen == set(data["train"][0])


def test_float16_features_stored_and_read_as_float32(tmp_path):
    out, data = _write(tmp_path, dtype=np.float16)
    assert load_manifest(out).feature_dtype == "float16"
    assert pq.read_schema(split_files(out, "val")[0]).field("image").type.value_type == "halffloat"
    _, _, feats, _ = split_arrays(out, "val")
    np.testing.assert_array_equal(feats, data["val"][2].astype(np.float16).astype(np.float32))


def test_feature_index_maps_rows_to_feature_matrix(tmp_path):
    feats = np.arange(12, dtype=np.float32).reshape(3, 4)
    shards = write_split(
        tmp_path,
        "train",
        np.array([5, 5, 6, 7]),
        np.arange(4),
        feats,
        ["a", "b", "c", "d"],
        feature_index=np.array([2, 2, 0, 1]),
    )
    table = pq.read_table(tmp_path / shards[0].file)
    np.testing.assert_array_equal(np.stack(table.column("image").to_pylist()), feats[[2, 2, 0, 1]])


def test_writer_refuses_scattered_image_and_cleans_up(tmp_path):
    with pytest.raises(
        RaydistDataError, match=r"train/part-00002.parquet: row 0: field 'image_id'.*image_id 1"
    ):
        write_split(
            tmp_path,
            "train",
            np.array([1, 1, 2, 2, 1]),
            np.arange(5),
            np.zeros((5, 2)),
            list("abcde"),
            rows_per_shard=2,
        )
    assert not list((tmp_path / "train").glob("*.parquet"))


def test_writer_refuses_bad_values(tmp_path):
    feats = np.zeros((3, 2))
    feats[1, 0] = np.nan
    with pytest.raises(RaydistDataError, match=r"row 1: field 'image'.*NaN.*sample_id 11"):
        write_split(tmp_path, "train", np.array([1, 2, 3]), np.array([10, 11, 12]), feats, ["a", "b", "c"])
    with pytest.raises(RaydistDataError, match="expected 3 captions"):
        write_split(tmp_path, "val", np.array([1, 2, 3]), np.arange(3), np.zeros((3, 2)), ["a"])


def test_dataset_writer_is_atomic_and_guards_existing_folders(tmp_path):
    out = tmp_path / "ds"
    with pytest.raises(RuntimeError), DatasetWriter(out) as w:
        w.add_split("train", np.array([1]), np.array([1]), np.zeros((1, 2)), ["a"])
        raise RuntimeError("crash mid-way")
    assert not out.exists() and not list(tmp_path.iterdir())  # staging folder removed too
    _write(tmp_path)
    with pytest.raises(RaydistDataError, match="already exists"):
        DatasetWriter(out)
    other = tmp_path / "notes"
    other.mkdir()
    (other / "x.txt").write_text("keep me")
    with pytest.raises(RaydistDataError, match="not a raydist dataset"):
        DatasetWriter(other, overwrite=True)
    before = load_manifest(out).splits["train"].shards[0].sha256
    with DatasetWriter(out, overwrite=True) as w:
        w.vocab = Vocab.build(["x"])
        for i, split in enumerate(("train", "val", "test")):
            w.add_split(split, np.array([i]), np.array([i]), np.ones((1, 3)), ["x"])
    assert (
        load_manifest(out).feature_dim == 3 and load_manifest(out).splits["train"].shards[0].sha256 != before
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "notes"]


def test_read_split_unknown_split_and_missing_manifest(tmp_path):
    out, _ = _write(tmp_path)
    with pytest.raises(RaydistDataError, match="unknown split 'dev'"):
        read_split(out, "dev")
    with pytest.raises(RaydistDataError, match="manifest.json: missing"):
        read_split(tmp_path, "train")


def test_feature_matrix_from_arrow_and_ray_style_batches(tmp_path):
    out, data = _write(tmp_path)
    table = pq.read_table(split_files(out, "train")[1])
    start = len(pq.read_table(split_files(out, "train")[0]))
    expected = data["train"][2][start : start + table.num_rows]
    np.testing.assert_array_equal(feature_matrix(table.column("image")), expected)
    np.testing.assert_array_equal(feature_matrix(table.column("image").combine_chunks()[1:]), expected[1:])
    per_row = np.empty(len(expected), dtype=object)  # what ray.data numpy batches hold for fixed_size_list
    per_row[:] = list(expected)
    got = feature_matrix(per_row)
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
