"""Converters: VSE++ precomputed layout (both image layouts, mismatch error) and COCO-style JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from raydist.converters.coco_json import convert_coco_json
from raydist.converters.vsepp_precomp import convert_vsepp_precomp
from raydist.data import (
    RaydistDataError,
    Vocab,
    load_manifest,
    split_arrays,
    validate_dataset,
)

CPI = 2


def _precomp(src, per_caption: bool, images=(3, 2, 2), dim=3):
    """VSE++ folder: images with distinct features; captions '<split> image <k> caption <j>'."""
    src.mkdir()
    rng = np.random.default_rng(0)
    expected = {}
    for prefix, n in zip(("train", "dev", "test"), images, strict=False):
        ims = rng.normal(size=(n, dim)).astype(np.float32)
        caps = [
            f"{prefix} image {k} caption {j}" + (" trainword" if prefix == "train" else " testword")
            for k in range(n)
            for j in range(CPI)
        ]
        np.save(src / f"{prefix}_ims.npy", np.repeat(ims, CPI, axis=0) if per_caption else ims)
        (src / f"{prefix}_caps.txt").write_text("\n".join(caps) + "\n")
        expected[prefix] = (ims, caps)
    return expected


@pytest.mark.parametrize("per_caption", [False, True])
def test_vsepp_precomp_both_layouts(tmp_path, per_caption):
    expected = _precomp(tmp_path / "src", per_caption)
    out = convert_vsepp_precomp(tmp_path / "src", tmp_path / "out", captions_per_image=CPI, min_count=1)
    assert validate_dataset(out).ok
    first_image = 0
    for split, prefix in (("train", "train"), ("val", "dev"), ("test", "test")):
        ims, caps = expected[prefix]
        image_ids, sample_ids, feats, got_caps = split_arrays(out, split)
        assert got_caps == caps
        local = np.arange(len(caps)) // CPI  # caption k <-> image k // CPI
        np.testing.assert_array_equal(image_ids, first_image + local)
        np.testing.assert_array_equal(feats, ims[local])
        assert len(set(sample_ids)) == len(caps)
        first_image += len(ims)
    vocab = Vocab.load(out / "vocab.json")
    assert "trainword" in vocab.index and "testword" not in vocab.index  # vocab from train only
    assert vocab.encode("testword", 3) == [1, 3, 2]
    assert load_manifest(out).source["converter"] == "vsepp_precomp"


def test_vsepp_min_count_and_custom_test_prefix(tmp_path):
    _precomp(tmp_path / "src", False)
    (tmp_path / "src" / "test_ims.npy").rename(tmp_path / "src" / "testall_ims.npy")
    (tmp_path / "src" / "test_caps.txt").rename(tmp_path / "src" / "testall_caps.txt")
    out = convert_vsepp_precomp(
        tmp_path / "src",
        tmp_path / "out",
        captions_per_image=CPI,
        min_count=4,
        splits={"train": "train", "val": "dev", "test": "testall"},
    )
    words = Vocab.load(out / "vocab.json").words[4:]
    # 6 train captions "train image k caption j trainword", k < 3, j < 2: "0" and "1" occur 5 times, "2" twice
    assert sorted(words) == ["0", "1", "caption", "image", "train", "trainword"]


def test_vsepp_row_count_mismatch_names_files_and_counts(tmp_path):
    _precomp(tmp_path / "src", False)
    np.save(tmp_path / "src" / "dev_ims.npy", np.zeros((3, 3), np.float32))  # 4 captions: need 2 or 4 rows
    with pytest.raises(
        RaydistDataError,
        match=r"dev_ims.npy has 3 rows but .*dev_caps.txt has 4 captions: "
        r"expected 2 rows .* or 4 \(one per caption\)",
    ):
        convert_vsepp_precomp(tmp_path / "src", tmp_path / "out", captions_per_image=CPI)
    assert not (tmp_path / "out").exists()


def test_vsepp_inconsistent_counts_name_what_would_fit(tmp_path):
    _precomp(tmp_path / "src", False)
    np.save(tmp_path / "src" / "dev_ims.npy", np.zeros((3, 3), np.float32))
    (tmp_path / "src" / "dev_caps.txt").write_text("".join(f"caption {k}\n" for k in range(5)))
    with pytest.raises(
        RaydistDataError,
        match=r"dev_ims.npy has 3 rows but .*dev_caps.txt has 5 captions: expected "
        r"5 rows \(one per caption; not a multiple of captions_per_image=2\)$",
    ):
        convert_vsepp_precomp(tmp_path / "src", tmp_path / "out", captions_per_image=CPI)
    (tmp_path / "src" / "dev_caps.txt").write_text("".join(f"caption {k}\n" for k in range(9)))
    with pytest.raises(RaydistDataError, match=r"has 9 captions: .*; captions_per_image=3 would fit"):
        convert_vsepp_precomp(tmp_path / "src", tmp_path / "out", captions_per_image=CPI)


def test_vsepp_per_caption_rows_repeat_in_every_group_or_none(tmp_path):
    _precomp(tmp_path / "src", True)
    a, b, c = np.eye(3, dtype=np.float32)
    np.save(tmp_path / "src" / "test_ims.npy", np.stack([a, a, b, c]))  # group 0 repeats, group 1 does not
    with pytest.raises(
        RaydistDataError,
        match=r"test_ims.npy: .*rows 0..1 repeat one image's features .* but row "
        r"3 differs from row 2 \(wrong captions_per_image\?\)",
    ):
        convert_vsepp_precomp(tmp_path / "src", tmp_path / "out", captions_per_image=CPI)


@pytest.mark.parametrize(
    "n", [3, 4]
)  # 3: not a multiple of CPI (the reported case); 4: rows that do not repeat
def test_vsepp_one_caption_per_image_is_inferred(tmp_path, n):
    expected = _precomp(tmp_path / "src", False)
    ims = np.random.default_rng(1).normal(size=(n, 3)).astype(np.float32)
    np.save(tmp_path / "src" / "dev_ims.npy", ims)
    (tmp_path / "src" / "dev_caps.txt").write_text("".join(f"dev image {k} only caption\n" for k in range(n)))
    out = convert_vsepp_precomp(tmp_path / "src", tmp_path / "out", captions_per_image=CPI, min_count=1)
    assert validate_dataset(out).ok
    image_ids, _, feats, caps = split_arrays(out, "val")
    n_train = len(expected["train"][0])
    np.testing.assert_array_equal(image_ids, n_train + np.arange(n))  # one image per caption, ids after train
    np.testing.assert_array_equal(feats, ims)
    assert caps == [f"dev image {k} only caption" for k in range(n)]
    test_ids = split_arrays(out, "test")[0]
    np.testing.assert_array_equal(test_ids, n_train + n + np.arange(len(test_ids)) // CPI)
    assert load_manifest(out).source["captions_per_image_by_split"] == {"train": CPI, "val": 1, "test": CPI}


def test_vsepp_empty_caption_line(tmp_path):
    _precomp(tmp_path / "src", False)
    (tmp_path / "src" / "train_caps.txt").write_text("a\n\nb\nc\nd\ne\n")
    with pytest.raises(RaydistDataError, match=r"train_caps.txt: line 2: empty caption"):
        convert_vsepp_precomp(tmp_path / "src", tmp_path / "out", captions_per_image=CPI)


def _coco(tmp_path, with_split: bool, karpathy: bool = False):
    ids = [42, 7, 13, 99, 5, 61]
    splits = {42: "train", 7: "restval", 13: "train", 99: "val", 5: "test", 61: "train"}
    caps = {i: [f"photo {i} number {j}" for j in range(1 + i % 3)] for i in ids}
    if karpathy:
        doc = {
            "images": [
                {"cocoid": i, "split": splits[i], "sentences": [{"raw": c} for c in caps[i]]} for i in ids
            ]
        }
    else:
        doc = {
            "images": [
                {"id": i, "file_name": f"{i}.jpg", **({"split": splits[i]} if with_split else {})}
                for i in ids
            ],
            "annotations": [{"image_id": i, "caption": c} for i in reversed(ids) for c in caps[i]],
        }
    (tmp_path / "caps.json").write_text(json.dumps(doc))
    feature_ids = np.array([5, 7, 13, 42, 61, 99, 1000])  # one extra, unused row
    feats = np.arange(len(feature_ids) * 2, dtype=np.float32).reshape(-1, 2) + feature_ids[:, None] * 100
    np.save(tmp_path / "feats.npy", feats)
    np.save(tmp_path / "ids.npy", feature_ids)
    return caps, {int(i): feats[k] for k, i in enumerate(feature_ids)}, splits


def _check_split(out, split, image_order, caps, feats):
    image_ids, _, got_feats, got_caps = split_arrays(out, split)
    assert list(image_ids) == [i for i in image_order for _ in caps[i]]
    assert got_caps == [c for i in image_order for c in caps[i]]
    np.testing.assert_array_equal(got_feats, np.stack([feats[i] for i in image_ids]))


@pytest.mark.parametrize("karpathy", [False, True])
def test_coco_json_with_split_field(tmp_path, karpathy):
    caps, feats, _ = _coco(tmp_path, with_split=True, karpathy=karpathy)
    out = convert_coco_json(
        tmp_path / "caps.json", tmp_path / "feats.npy", tmp_path / "ids.npy", tmp_path / "out", min_count=1
    )
    assert validate_dataset(out).ok
    _check_split(out, "train", [7, 13, 42, 61], caps, feats)  # restval joins train; sorted by id
    _check_split(out, "val", [99], caps, feats)
    _check_split(out, "test", [5], caps, feats)
    vocab = Vocab.load(out / "vocab.json")
    assert "42" in vocab.index and "99" not in vocab.index and "5" not in vocab.index  # train only
    assert load_manifest(out).source["unused_feature_rows"] == 1


def test_coco_json_counts_from_the_end_of_sorted_ids(tmp_path):
    caps, feats, _ = _coco(tmp_path, with_split=False)
    (tmp_path / "ids.json").write_text(json.dumps([5, 7, 13, 42, 61, 99, 1000]))
    out = convert_coco_json(
        tmp_path / "caps.json",
        tmp_path / "feats.npy",
        tmp_path / "ids.json",
        tmp_path / "out",
        val_images=2,
        test_images=1,
    )
    _check_split(out, "train", [5, 7, 13], caps, feats)
    _check_split(out, "val", [42, 61], caps, feats)
    _check_split(out, "test", [99], caps, feats)


def test_coco_json_errors_name_the_image(tmp_path):
    _coco(tmp_path, with_split=True)
    args = (tmp_path / "caps.json", tmp_path / "feats.npy", tmp_path / "ids.npy", tmp_path / "out")
    np.save(tmp_path / "ids.npy", np.array([5, 7, 13, 41, 61, 99, 1000]))
    with pytest.raises(RaydistDataError, match=r"caps.json: image id 42 has no feature row in .*ids.npy"):
        convert_coco_json(*args)
    _coco(tmp_path, with_split=True)
    doc = json.loads((tmp_path / "caps.json").read_text())
    doc["annotations"] = [a for a in doc["annotations"] if a["image_id"] != 13]
    (tmp_path / "caps.json").write_text(json.dumps(doc))
    with pytest.raises(RaydistDataError, match=r"caps.json: image id 13 has no captions"):
        convert_coco_json(*args)
    doc["annotations"].append({"image_id": 13, "caption": "   "})
    (tmp_path / "caps.json").write_text(json.dumps(doc))
    with pytest.raises(RaydistDataError, match=r"image id 13: caption 0 is empty"):
        convert_coco_json(*args)
    doc["annotations"][-1]["caption"] = "a fine caption"
    doc["images"][0]["split"] = "holdout"
    (tmp_path / "caps.json").write_text(json.dumps(doc))
    with pytest.raises(RaydistDataError, match=r"image id 42: field 'split': unknown value 'holdout'"):
        convert_coco_json(*args)
    with pytest.raises(RaydistDataError, match=r"split_map maps to unknown split\(s\) \['dev'\]"):
        convert_coco_json(*args, split_map={"train": "train", "holdout": "dev"})
    np.save(tmp_path / "ids.npy", np.array([5, 7, 13]))
    with pytest.raises(RaydistDataError, match=r"ids.npy lists 3 image ids but .*feats.npy has 7 rows"):
        convert_coco_json(*args)
    assert not (tmp_path / "out").exists()
