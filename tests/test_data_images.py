"""Encoded images in the shards (raydist/data/image_bytes.py, the encoded paths of shards.py, validate.py and
manifest.py): bytes stored as given, the manifest's image fields against an independent computation, and every
bad image refused by the writer and reported by validation with file, row and field."""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from raydist.data import DatasetWriter, RaydistDataError, Vocab, load_manifest, read_split, validate_dataset
from raydist.data import validate as validate_module
from raydist.data.image_bytes import ImageFiles, check_image
from raydist.data.manifest import manifest_from_dict


def encode(mode: str, height: int, width: int, fmt: str, seed: int = 0) -> bytes:
    """A noisy image (so a JPEG has real entropy-coded data to truncate) as PNG/JPEG/GIF file bytes."""
    rng = np.random.default_rng(seed)
    shape = (height, width) if mode == "L" else (height, width, 3)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(buf, format=fmt)
    return buf.getvalue()


def truncated_jpeg() -> bytes:
    data = encode("RGB", 32, 32, "JPEG", seed=5)
    return data[: len(data) * 2 // 3]


def corrupt_png() -> bytes:
    data = bytearray(encode("RGB", 16, 16, "PNG", seed=6))
    data[60:90] = bytes(30)  # inside the compressed IDAT stream
    return bytes(data)


# (height, width) of the train images below; their lower median per axis is computed in the test
TRAIN_SIZES = [(8, 12), (16, 8), (24, 32), (12, 20), (20, 16)]


def images(sizes, *, grey=False, seed=0):
    """Alternating PNG and JPEG images of the given sizes (greyscale or RGB)."""
    return [
        encode("L" if grey else "RGB", h, w, "PNG" if k % 2 else "JPEG", seed + k)
        for k, (h, w) in enumerate(sizes)
    ]


def write_pairs(out, train, val, test, *, rows_per_shard=2):
    """An encoded pairs dataset; image k of a split gets k % 3 + 1 captions."""
    captions = {}
    with DatasetWriter(out, rows_per_shard=rows_per_shard) as writer:
        writer.vocab = Vocab.build(["a dog", "a cat"], 1)
        first = 0
        for split, blobs in (("train", train), ("val", val), ("test", test)):
            caps = [[f"{split} image {k} caption {j}" for j in range(k % 3 + 1)] for k in range(len(blobs))]
            ids = first + np.arange(len(blobs))
            writer.add_split(split, 100 + ids, ids, blobs, caps)
            captions[split] = caps
            first += len(blobs)
    return captions


def write_labels(out, train, val, test, *, rows_per_shard=2):
    with DatasetWriter(out, task="labels", num_classes=3, rows_per_shard=rows_per_shard) as writer:
        first = 0
        for split, blobs in (("train", train), ("val", val), ("test", test)):
            ids = first + np.arange(len(blobs))
            writer.add_split(split, ids, ids, blobs, labels=ids % 3)
            first += len(blobs)


def lower_median(values):
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


@pytest.mark.parametrize(
    ("mode", "fmt", "channels"),
    [
        ("RGB", "PNG", 3),
        ("L", "PNG", 1),
        ("RGB", "JPEG", 3),
        ("L", "JPEG", 1),
        ("LA", "PNG", 1),
        ("RGBA", "PNG", 3),
    ],
)
def test_check_image_reads_format_size_and_channels(mode, fmt, channels):
    buf = io.BytesIO()
    Image.new(mode, (9, 7)).save(buf, format=fmt)
    info = check_image(buf.getvalue())
    assert (info.format, info.height, info.width, info.channels) == (fmt, 7, 9, channels)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "zero-size"),
        (truncated_jpeg(), "truncated"),
        (corrupt_png(), "corrupt"),
        (encode("RGB", 8, 8, "GIF"), "unsupported image format GIF"),
        (b"not an image at all", "corrupt"),
    ],
)
def test_check_image_says_why(data, reason):
    with pytest.raises(RaydistDataError, match=reason):
        check_image(data)


def test_encoded_pairs_roundtrip_bytes_captions_and_manifest(tmp_path):
    train, val, test = (
        images(TRAIN_SIZES),
        images([(8, 8), (10, 6)], seed=10),
        images([(30, 9)], grey=True, seed=20),
    )
    captions = write_pairs(tmp_path / "ds", train, val, test)
    raw = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert raw["image_format"] == "encoded" and "feature_dim" not in raw and raw["image_channels"] == 3
    assert raw["image_size"] == [
        lower_median(h for h, _ in TRAIN_SIZES),
        lower_median(w for _, w in TRAIN_SIZES),
    ]
    assert raw["image_size"] == [16, 16]
    assert raw["splits"]["train"]["rows"] == raw["splits"]["train"]["images"] == 5
    manifest = load_manifest(tmp_path / "ds")
    assert manifest.feature_dim is None and manifest.image_format == "encoded"
    for split, blobs in (("train", train), ("val", val), ("test", test)):
        table = read_split(tmp_path / "ds", split)
        assert table.schema.field("image").type == pa.binary() and "caption" not in table.column_names
        assert table.column("image").to_pylist() == blobs  # the bytes as given, not re-encoded
        assert table.column("captions").to_pylist() == captions[split]
    shard = pq.read_table(tmp_path / "ds" / "train" / "part-00000.parquet")
    assert shard.num_rows == 2 and shard.column("sample_id").to_pylist() == [0, 1]
    report = validate_dataset(tmp_path / "ds")
    assert report.ok, report.format()
    assert "decoded 5 of 5 images" in report.format() and "median size 16x16" in report.format()


def test_channels_one_only_when_every_image_is_greyscale(tmp_path):
    grey = images(TRAIN_SIZES, grey=True)
    write_labels(tmp_path / "grey", grey, grey[:2], grey[2:4])
    assert load_manifest(tmp_path / "grey").image_channels == 1
    write_labels(tmp_path / "mixed", grey, grey[:2], images([(8, 8)]))  # one colour test image
    assert load_manifest(tmp_path / "mixed").image_channels == 3
    table = read_split(tmp_path / "grey", "train")
    assert table.column("label").to_pylist() == [0, 1, 2, 0, 1]
    assert table.column("image").to_pylist() == grey


def test_image_files_read_lazily_and_name_a_missing_file(tmp_path):
    (tmp_path / "a.png").write_bytes(b"abc")
    files = ImageFiles([tmp_path / "a.png", tmp_path / "gone.png"])
    assert len(files) == 2 and files[0] == b"abc"
    with pytest.raises(RaydistDataError, match="gone.png: cannot read image file"):
        files[1]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (b"", "zero-size image"),
        (truncated_jpeg(), "truncated"),
        (corrupt_png(), "corrupt"),
        (encode("RGB", 8, 8, "GIF"), "unsupported image format GIF"),
    ],
)
def test_writer_refuses_a_bad_image_and_writes_nothing(tmp_path, bad, reason):
    train = images(TRAIN_SIZES)
    train[3] = bad
    with pytest.raises(RaydistDataError, match=rf"train/part-00001.parquet: row 1: field 'image': {reason}"):
        write_labels(tmp_path / "ds", train, train[:2], train[:2])
    assert not (tmp_path / "ds").exists() and list(tmp_path.iterdir()) == []


def test_writer_names_the_source_of_a_bad_image(tmp_path):
    blobs = images([(8, 8), (8, 8)])
    blobs[1] = truncated_jpeg()
    writer = DatasetWriter(tmp_path / "ds", task="labels", num_classes=2)
    with pytest.raises(
        RaydistDataError, match=r"refusing to write split 'train': /src/b.jpg: truncated.*sample_id 1"
    ):
        writer.add_split(
            "train",
            np.arange(2),
            np.arange(2),
            blobs,
            labels=np.arange(2),
            image_sources=["/src/a.png", "/src/b.jpg"],
        )
    writer.abort()


@pytest.mark.parametrize(
    ("captions", "match"),
    [
        ([["a"], []], r"row 1: field 'captions': no captions"),
        ([["a"], ["b", "  "]], r"row 1: field 'captions': a caption is empty"),
        ([["a"], "b"], r"captions: row 1 is a string; each row .* holds the list of the image's captions"),
    ],
)
def test_writer_refuses_bad_caption_lists(tmp_path, captions, match):
    writer = DatasetWriter(tmp_path / "ds")
    with pytest.raises(RaydistDataError, match=match):
        writer.add_split("train", np.arange(2), np.arange(2), images([(8, 8), (8, 8)]), captions)
    writer.abort()


def test_writer_refuses_two_rows_of_one_image_and_mixed_formats(tmp_path):
    writer = DatasetWriter(tmp_path / "ds", task="labels", num_classes=2)
    with pytest.raises(RaydistDataError, match=r"row 1: field 'image_id'.*each image in one row"):
        writer.add_split(
            "train", np.array([4, 4]), np.arange(2), images([(8, 8), (8, 8)]), labels=np.zeros(2)
        )
    writer.add_split("train", np.arange(2), np.arange(2), images([(8, 8), (8, 8)]), labels=np.zeros(2))
    with pytest.raises(
        RaydistDataError, match="split 'val': images are features but earlier splits are encoded"
    ):
        writer.add_split("val", np.arange(2, 4), np.arange(2, 4), np.zeros((2, 3)), labels=np.zeros(2))
    writer.abort()


def _replace_image(ds, file, row, data):
    """Put ``data`` into one row's image of a shard and re-register the shard's sha256, so only that defect
    remains."""
    path = ds / file
    table = pq.read_table(path)
    blobs = table.column("image").to_pylist()
    blobs[row] = data
    table = table.set_column(table.schema.get_field_index("image"), "image", pa.array(blobs, pa.binary()))
    pq.write_table(table, path)
    raw = json.loads((ds / "manifest.json").read_text())
    for split in raw["splits"].values():
        for shard in split["shards"]:
            if shard["file"] == file:
                shard["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (ds / "manifest.json").write_text(json.dumps(raw))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (truncated_jpeg(), "truncated"),
        (corrupt_png(), "corrupt"),
        (b"", "zero-size"),
        (encode("L", 8, 8, "GIF"), "unsupported"),
    ],
)
def test_validate_reports_a_bad_image_row(tmp_path, data, reason):
    ds = tmp_path / "ds"
    write_pairs(ds, images(TRAIN_SIZES), images([(8, 8)] * 2), images([(8, 8)]))
    _replace_image(ds, "train/part-00001.parquet", 1, data)
    report = validate_dataset(ds)
    assert len(report.problems) == 1, report.format()
    problem = report.problems[0]
    assert (problem.file, problem.row, problem.field) == ("train/part-00001.parquet", 1, "image")
    assert reason in problem.message and "sample_id 3" in problem.message
    with pytest.raises(RaydistDataError, match=rf"train/part-00001.parquet: row 1: field 'image': {reason}"):
        read_split(ds, "train")
    assert read_split(ds, "train", verify=False).num_rows == 5


def test_image_sample_decodes_only_n_per_split(tmp_path, monkeypatch):
    ds = tmp_path / "ds"
    write_labels(ds, images(TRAIN_SIZES * 2), images([(8, 8)] * 4), images([(8, 8)] * 3))
    decoded = []
    real = validate_module.check_image
    monkeypatch.setattr(validate_module, "check_image", lambda data: decoded.append(data) or real(data))
    report = validate_dataset(ds, image_sample=2)
    assert report.ok and len(decoded) == 6  # 2 of train's 10, 2 of val's 4, 2 of test's 3
    assert "decoded 2 of 10 images" in report.format() and "decoded 2 of 3 images" in report.format()
    first = list(decoded)
    decoded.clear()
    validate_dataset(ds, image_sample=2)
    assert decoded == first  # the same draw for the same seed
    decoded.clear()
    validate_dataset(ds, image_sample=2, seed=1)
    assert decoded != first
    decoded.clear()
    assert validate_dataset(ds, image_sample=50).ok and len(decoded) == 17  # capped at each split's rows


def test_image_sample_finds_a_bad_image_only_when_drawn(tmp_path):
    ds = tmp_path / "ds"
    write_labels(ds, images(TRAIN_SIZES), images([(8, 8)] * 2), images([(8, 8)] * 2))
    _replace_image(ds, "train/part-00000.parquet", 0, truncated_jpeg())
    assert not validate_dataset(ds).ok
    assert validate_dataset(ds, image_sample=0).ok  # nothing decoded: the bad bytes go unseen
    assert "decoded 0 of 5 images" in validate_dataset(ds, image_sample=0).format()
    assert not validate_dataset(ds, image_sample=5).ok
    _replace_image(ds, "train/part-00000.parquet", 0, b"")
    assert [p.field for p in validate_dataset(ds, image_sample=0).problems] == ["image"]  # zero-size: always


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"feature_dim": 4}, "field 'feature_dim': an 'encoded' dataset has no feature dim"),
        ({"image_size": None}, "field 'image_size': missing"),
        ({"image_channels": 2}, "field 'image_channels': expected 1 .* or 3"),
        ({"image_size": [8]}, r"field 'image_size': expected \[height, width\]"),
        ({"image_format": "pixels"}, "field 'image_format': expected one of"),
    ],
)
def test_manifest_image_fields(tmp_path, change, message):
    write_labels(tmp_path / "ds", images([(8, 8)]), images([(8, 8)]), images([(8, 8)]))
    raw = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert manifest_from_dict(raw).image_size == [8, 8]
    with pytest.raises(RaydistDataError, match=message):
        manifest_from_dict({**raw, **change})


def test_feature_manifest_without_image_format_reads_as_features():
    raw = {
        "format_version": 1,
        "task": "labels",
        "feature_dim": 4,
        "num_classes": 2,
        "splits": {s: {"rows": 0, "images": 0, "shards": []} for s in ("train", "val", "test")},
    }
    assert manifest_from_dict(raw).image_format == "features"
    with pytest.raises(RaydistDataError, match="field 'image_channels': only an 'encoded' dataset has it"):
        manifest_from_dict({**raw, "image_channels": 3})
    with pytest.raises(RaydistDataError, match="field 'feature_dim': missing"):
        manifest_from_dict({k: v for k, v in raw.items() if k != "feature_dim"})


def test_encoded_shard_with_a_caption_column_is_refused(tmp_path):
    ds = tmp_path / "ds"
    write_pairs(ds, images(TRAIN_SIZES), images([(8, 8)]), images([(8, 8)]))
    path = ds / "val" / "part-00000.parquet"
    pq.write_table(pq.read_table(path).append_column("caption", pa.array(["x"])), path)
    problems = [str(p) for p in validate_dataset(ds).problems]
    assert any(
        "val/part-00000.parquet: field 'caption': unexpected column" in p and "'captions'" in p
        for p in problems
    ), problems
