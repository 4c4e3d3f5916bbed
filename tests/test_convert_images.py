"""Converters from image files (raydist/converters/karpathy.py, coco_json.py, image_folder.py) on tiny
real-format fixtures written with Pillow: a Karpathy split JSON, a COCO captions JSON and ImageFolder trees.
The shards must hold the files' bytes, the captions, splits and labels the sources say; every bad input is
refused naming its file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from raydist.cli import main
from raydist.converters.coco_json import convert_coco_images
from raydist.converters.image_folder import convert_image_folder
from raydist.converters.karpathy import convert_karpathy
from raydist.data import RaydistDataError, Vocab, load_manifest, read_split, validate_dataset


def save(path: Path, mode: str = "RGB", size: tuple[int, int] = (12, 10), seed: int = 0) -> bytes:
    """Write a noisy image of ``size`` (width, height) in the format its suffix names; return the file's bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shape = (size[1], size[0]) if mode == "L" else (size[1], size[0], 3)
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(path)
    return path.read_bytes()


def lower_median(values):
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


# Karpathy fixture: (filepath, filename, split, sentences, mode, (width, height))
KARPATHY = [
    (
        "train2014",
        "a.jpg",
        "train",
        [{"raw": " A red bus. ", "tokens": ["a", "red", "bus"]}, {"raw": "A red bus parked", "tokens": []}],
        "RGB",
        (16, 8),
    ),
    ("val2014", "b.png", "restval", [{"tokens": ["a", "grey", "cat"]}], "L", (10, 20)),
    ("train2014", "c.png", "val", [{"raw": "a dog"}], "RGB", (8, 8)),
    ("val2014", "d.jpg", "test", [{"raw": "a zebra"}, {"raw": "zebra zebra"}], "L", (9, 9)),
    ("train2014", "e.png", "train", [{"raw": "a red car"}], "RGB", (24, 12)),
    ("val2014", "f.jpg", "test", [{"raw": "a bird"}], "RGB", (8, 30)),
]


@pytest.fixture
def karpathy(tmp_path):
    """``(dataset.json, image root, {filename: bytes})`` of the KARPATHY images."""
    root, entries, data = tmp_path / "images", [], {}
    for k, (filepath, filename, split, sentences, mode, size) in enumerate(KARPATHY):
        data[filename] = save(root / filepath / filename, mode, size, seed=k)
        entries.append(
            {
                "filepath": filepath,
                "filename": filename,
                "split": split,
                "sentences": sentences,
                "imgid": k,
                "cocoid": 1000 + k,
            }
        )
    src = tmp_path / "dataset_coco.json"
    src.write_text(json.dumps({"images": entries, "dataset": "coco"}))
    return src, root, data


def test_karpathy_shards_hold_the_files_captions_and_splits(tmp_path, karpathy):
    src, root, data = karpathy
    out = convert_karpathy(src, root, tmp_path / "out", min_count=1)
    expected = {  # split -> (filenames in file order, captions); restval joins train
        "train": (
            ["a.jpg", "b.png", "e.png"],
            [["A red bus.", "A red bus parked"], ["a grey cat"], ["a red car"]],
        ),
        "val": (["c.png"], [["a dog"]]),
        "test": (["d.jpg", "f.jpg"], [["a zebra", "zebra zebra"], ["a bird"]]),
    }
    cocoid = {row[1]: 1000 + k for k, row in enumerate(KARPATHY)}
    sample_ids = []
    for split, (names, captions) in expected.items():
        table = read_split(out, split)
        assert table.column("image").to_pylist() == [data[n] for n in names]
        assert table.column("captions").to_pylist() == captions
        assert table.column("image_id").to_pylist() == [cocoid[n] for n in names]
        sample_ids += table.column("sample_id").to_pylist()
    assert sample_ids == list(range(6))
    manifest = load_manifest(out)
    sizes = {row[1]: row[5] for row in KARPATHY}
    train_sizes = [sizes[n] for n in expected["train"][0]]
    assert (
        manifest.image_format == "encoded" and manifest.image_channels == 3 and manifest.feature_dim is None
    )
    assert manifest.image_size == [
        lower_median(h for _, h in train_sizes),
        lower_median(w for w, _ in train_sizes),
    ]
    assert manifest.source["image_id"] == "cocoid"
    vocab = Vocab.load(out / manifest.vocab)
    assert {"red", "bus", "grey", "cat"} <= set(vocab.words) and not {"zebra", "dog"} & set(vocab.words)
    assert validate_dataset(out).ok


def test_karpathy_without_filepath_or_coco_ids(tmp_path):
    root = tmp_path / "flickr"
    data = [save(root / f"{k}.jpg", seed=k) for k in range(3)]
    entries = [
        {"filename": f"{k}.jpg", "split": split, "sentences": [{"raw": f"photo {k}"}], "imgid": 7 - k}
        for k, split in enumerate(["train", "val", "test"])
    ]
    (tmp_path / "dataset_flickr8k.json").write_text(json.dumps({"images": entries}))
    out = convert_karpathy(tmp_path / "dataset_flickr8k.json", root, tmp_path / "out")
    for k, split in enumerate(["train", "val", "test"]):
        table = read_split(out, split)
        assert table.column("image").to_pylist() == [data[k]] and table.column("image_id").to_pylist() == [
            7 - k
        ]
    assert load_manifest(out).source["image_id"] == "imgid"


def _karpathy_case(src, root, case):
    """Plant one defect in the Karpathy fixture; return the text the error must contain."""
    doc = json.loads(src.read_text())
    if case == "missing file":
        (root / "val2014" / "d.jpg").unlink()
        return str(root / "val2014" / "d.jpg")
    if case == "zero-size file":
        (root / "val2014" / "d.jpg").write_bytes(b"")
        return f"{root / 'val2014' / 'd.jpg'} is empty"
    if case == "corrupt png":
        path = root / "train2014" / "e.png"
        blob = bytearray(path.read_bytes())
        blob[60:90] = bytes(30)
        path.write_bytes(bytes(blob))
        return f"{path}: corrupt"
    if case == "truncated jpeg":
        path = root / "train2014" / "a.jpg"
        path.write_bytes(path.read_bytes()[:300])
        return f"{path}: truncated"
    if case == "gif":
        path = root / "train2014" / "c.png"
        Image.new("RGB", (8, 8)).save(path, format="GIF")
        return f"{path}: unsupported image format GIF"
    if case == "no split":
        del doc["images"][3]["split"]
        src.write_text(json.dumps(doc))
        return r"images\[3\] \(val2014/d.jpg\): field 'split': missing"
    if case == "unknown split":
        doc["images"][3]["split"] = "holdout"
        src.write_text(json.dumps(doc))
        return r"images\[3\] \(val2014/d.jpg\): field 'split': unknown value 'holdout'"
    doc["images"][4]["sentences"] = []
    src.write_text(json.dumps(doc))
    return r"images\[4\] \(train2014/e.png\): image without captions"


@pytest.mark.parametrize(
    "case",
    [
        "missing file",
        "zero-size file",
        "corrupt png",
        "truncated jpeg",
        "gif",
        "no split",
        "unknown split",
        "no captions",
    ],
)
def test_karpathy_bad_inputs_name_the_file(tmp_path, karpathy, case):
    src, root, _ = karpathy
    expected = _karpathy_case(src, root, case)
    with pytest.raises(RaydistDataError, match=expected) as info:
        convert_karpathy(src, root, tmp_path / "out")
    assert str(src) in str(info.value) or str(root) in str(info.value)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))


@pytest.fixture
def coco(tmp_path):
    """A COCO captions JSON without a split field over 5 images in a folder; ``(json, folder, {id: bytes})``."""
    folder, images, annotations, data = tmp_path / "train2014", [], [], {}
    for k, image_id in enumerate([42, 7, 19, 3, 88]):
        name = f"COCO_train2014_{image_id:012d}.{'png' if k % 2 else 'jpg'}"
        data[image_id] = save(folder / name, "L" if k == 1 else "RGB", (10 + k, 12), seed=k)
        images.append({"id": image_id, "file_name": name})
        annotations += [
            {"image_id": image_id, "caption": f" image {image_id} caption {j}\n"} for j in range(k % 2 + 1)
        ]
    path = tmp_path / "captions_train2014.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations}))
    return path, folder, data


def test_coco_images_split_by_sorted_id(tmp_path, coco):
    path, folder, data = coco
    out = convert_coco_images(path, folder, tmp_path / "out", val_images=1, test_images=2, min_count=1)
    ids = {"train": [3, 7], "val": [19], "test": [42, 88]}  # sorted ids 3 7 19 42 88: last 2 test, 1 val
    caps_per_image = {42: 1, 7: 2, 19: 1, 3: 2, 88: 1}
    for split, members in ids.items():
        table = read_split(out, split)
        assert table.column("image_id").to_pylist() == members
        assert table.column("image").to_pylist() == [data[i] for i in members]
        assert table.column("captions").to_pylist() == [
            [f"image {i} caption {j}" for j in range(caps_per_image[i])] for i in members
        ]
    assert load_manifest(out).image_size == [12, 11]  # train images 3 (13x12) and 7 (11x12): lower median


def test_coco_images_bad_inputs_name_the_file(tmp_path, coco):
    path, folder, _ = coco
    (folder / "COCO_train2014_000000000019.jpg").unlink()
    with pytest.raises(RaydistDataError, match=r"image id 19 .*COCO_train2014_000000000019.jpg is missing"):
        convert_coco_images(path, folder, tmp_path / "out", val_images=1, test_images=1)
    doc = json.loads(path.read_text())
    doc["images"].append({"id": 5, "file_name": "x.jpg"})
    path.write_text(json.dumps(doc))
    with pytest.raises(RaydistDataError, match=rf"{path}: image id 5 \(x.jpg\) has no captions"):
        convert_coco_images(path, folder, tmp_path / "out", val_images=1, test_images=1)


def test_cli_converts_coco_with_images_and_validates_a_sample(tmp_path, coco, capsys):
    path, folder, data = coco
    doc = json.loads(path.read_text())
    for image, split in zip(doc["images"], ["train", "dev", "restval", "test", "train"], strict=False):
        image["split"] = split
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    assert (
        main(
            [
                "convert",
                "coco-json",
                "--captions",
                str(path),
                "--images",
                str(folder),
                "--out",
                str(out),
                "--splits",
                "train=train,train=restval,val=dev,test=test",
            ]
        )
        == 0
    )
    assert read_split(out, "train").column("image_id").to_pylist() == [19, 42, 88]
    assert read_split(out, "val").column("image").to_pylist() == [data[7]]
    assert main(["validate", str(out), "--image-sample", "2"]) == 0
    assert "decoded 2 of 3 images" in capsys.readouterr().out
    assert (
        main(
            [
                "convert",
                "coco-json",
                "--captions",
                str(path),
                "--images",
                str(folder),
                "--features",
                "f.npy",
                "--feature-ids",
                "i.npy",
                "--out",
                str(tmp_path / "o2"),
            ]
        )
        == 2
    )
    assert "either --images DIR or --features" in capsys.readouterr().err
    assert main(["convert", "karpathy", "--src", str(path), "--out", str(tmp_path / "o3")]) == 2
    assert "convert karpathy: give --images" in capsys.readouterr().err


def _folder(root: Path, classes: dict[str, int], seed: int = 0) -> dict[Path, bytes]:
    """``classes``: name -> number of images, with suffixes cycling .png/.JPG/.jpeg; returns {path: bytes}."""
    files = {}
    for c, (name, n) in enumerate(classes.items()):
        for k in range(n):
            path = root / name / f"img{k}{['.png', '.JPG', '.jpeg'][k % 3]}"
            files[path] = save(path, "L" if k % 2 else "RGB", (8 + k, 8), seed=seed + 10 * c + k)
    return files


def _rows(out, split):
    table = read_split(out, split)
    return table.column("image").to_pylist(), table.column("label").to_pylist()


def test_image_folder_split_folders(tmp_path, capsys):
    src = tmp_path / "birds"
    files = {
        **_folder(src / "train", {"wren": 2, "crow": 2}),
        **_folder(src / "val", {"crow": 1}, seed=100),
        **_folder(src / "test", {"auk": 2}, seed=200),
    }
    (src / "train" / "wren" / "notes.txt").write_text("not an image")
    (src / "README").write_text("hi")
    out = convert_image_folder(src, tmp_path / "out")
    classes = ["auk", "crow", "wren"]  # the union, by name -> labels 0, 1, 2
    manifest = load_manifest(out)
    assert manifest.source["classes"] == classes and manifest.num_classes == 3
    assert manifest.source["ignored_files"] == {".txt": 1, "no suffix": 1}
    assert "ignored 2 file(s)" in capsys.readouterr().out
    for split in ("train", "val", "test"):
        paths = sorted((p for p in files if p.parts[-3] == split), key=lambda p: (p.parent.name, p.name))
        assert _rows(out, split) == ([files[p] for p in paths], [classes.index(p.parent.name) for p in paths])
    assert read_split(out, "train").column("image_id").to_pylist() == [0, 1, 2, 3]
    assert validate_dataset(out).ok


def test_image_folder_split_by_image_is_stratified(tmp_path):
    files = _folder(tmp_path / "src", {"a": 10, "b": 5, "c": 20})
    out = convert_image_folder(
        tmp_path / "src", tmp_path / "out", val_fraction=0.2, test_fraction=0.3, seed=3
    )
    label_of = {data: "abc".index(path.parent.name) for path, data in files.items()}
    seen = []
    for split, fraction in (("val", 0.2), ("test", 0.3)):
        blobs, labels = _rows(out, split)
        assert labels == [label_of[b] for b in blobs]
        assert [labels.count(k) for k in range(3)] == [
            round(n * fraction) for n in (10, 5, 20)
        ]  # 2 1 4, 3 2 6
        seen += blobs
    seen += _rows(out, "train")[0]
    assert sorted(seen) == sorted(files.values())  # every image once


def test_image_folder_split_by_class_is_disjoint(tmp_path):
    files = _folder(tmp_path / "src", {f"class{k}": 2 + k % 3 for k in range(10)})
    out = convert_image_folder(
        tmp_path / "src", tmp_path / "out", split_by="class", val_fraction=0.2, test_fraction=0.3, seed=1
    )
    classes_of = {}
    for split in ("train", "val", "test"):
        blobs, labels = _rows(out, split)
        classes_of[split] = set(labels)
        for label in set(labels):  # all of a class's images go together
            name = f"class{label}"
            assert sorted(b for b, y in zip(blobs, labels, strict=False) if y == label) == sorted(
                d for p, d in files.items() if p.parent.name == name
            )
    assert [len(classes_of[s]) for s in ("train", "val", "test")] == [5, 2, 3]
    assert set.union(*classes_of.values()) == set(range(10))


@pytest.mark.parametrize("case", ["empty class", "partial splits", "corrupt"])
def test_image_folder_bad_inputs_name_the_folder_or_file(tmp_path, case):
    src = tmp_path / "src"
    files = _folder(src, {"a": 10, "b": 10})  # every split gets images: the planted defect is the only one
    if case == "empty class":
        (src / "c").mkdir()
        (src / "c" / "list.txt").write_text("x")
        expected = f"{src / 'c'}: empty class folder"
    elif case == "partial splits":
        _folder(src / "train", {"a": 1})
        expected = r"has split folder\(s\) \['train'\] but not \['val', 'test'\]"
    else:
        path = next(iter(files))
        path.write_bytes(path.read_bytes()[:40])
        expected = f"split 'train': {path}: corrupt"
    with pytest.raises(RaydistDataError, match=expected):
        convert_image_folder(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_converter_names_every_bad_file_in_one_pass(tmp_path):
    """Zero-byte files are named by their path (not a staging shard's row), and every missing, empty or
    undecodable file of every split is reported at once (counted past the cap); nothing is written."""
    from raydist.data.shards import PROBLEMS_SHOWN

    src = tmp_path / "src"
    files = sorted(_folder(src, {"a": 10, "b": 10}))
    empty = files[:2]
    for path in empty:
        path.write_bytes(b"")
    with pytest.raises(RaydistDataError) as info:
        convert_image_folder(src, tmp_path / "out")
    message = str(info.value)
    assert all(f"{path} is empty (0 bytes)" in message for path in empty)
    assert "part-" not in message and not (tmp_path / "out").exists()
    for path in empty:
        path.write_bytes(b"not an image")
    broken = {p for p in files if p.stem in ("img3", "img7", "img9")} | set(empty)
    for path in broken:
        path.write_bytes(b"not an image")
    with pytest.raises(RaydistDataError) as info:
        convert_image_folder(src, tmp_path / "out")
    named = {p for p in files if f"{p}: corrupt" in str(info.value)}
    assert named == broken and f"{len(broken)} problems" in str(info.value)
    splits = {line.split("'")[1] for line in str(info.value).splitlines()[1:]}
    assert len(splits) > 1  # the bad files of later splits are found in the same pass
    many = tmp_path / "many"
    for path in _folder(many, {"a": 20, "b": 20}):
        path.write_bytes(b"")
    with pytest.raises(RaydistDataError) as info:
        convert_image_folder(many, tmp_path / "out")
    lines = str(info.value).splitlines()
    assert "40 problems" in lines[0] and len(lines) == 1 + PROBLEMS_SHOWN + 1
    assert lines[-1].strip() == f"... and {40 - PROBLEMS_SHOWN} more"


def test_cli_converts_an_image_folder(tmp_path, capsys):
    _folder(tmp_path / "src", {"a": 3, "b": 3, "c": 3})
    out = tmp_path / "out"
    assert (
        main(
            [
                "convert",
                "image-folder",
                "--src",
                str(tmp_path / "src"),
                "--out",
                str(out),
                "--split-by",
                "class",
                "--val-fraction",
                "0.3",
                "--test-fraction",
                "0.3",
            ]
        )
        == 0
    )
    shown = capsys.readouterr().out
    assert "wrote dataset" in shown
    assert [len(set(_rows(out, s)[1])) for s in ("train", "val", "test")] == [1, 1, 1]
    # what it did, per split: images, rows and classes counted from the written rows here
    for split in ("train", "val", "test"):
        labels = _rows(out, split)[1]
        n = len(labels)
        want = f"  {split:<6}{n:>9,} images{n:>9,} rows  {len(set(labels)):>5} classes"
        assert want.replace(" ", "") in shown.replace(" ", ""), (want, shown)
    assert "task labels, encoded images" in shown
