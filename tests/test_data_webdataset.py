"""WebDataset shards read directly (raydist/data/webdataset.py), with tar files written by ``tarfile`` in
img2dataset's layout (raydist/data/synthetic_webdataset.py): the index lists every sample once with the bytes,
caption or class the tar holds (read back here with ``tarfile``, not raydist's reader); img2dataset's side files
are ignored; the index is reused until a shard changes; every defect is refused naming the shard and the key.
Training from tars with Ray Train workers, local and from S3: tests/test_object_storage_runs.py (cluster step)."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest

from raydist.cli import main
from raydist.data import load_manifest, validate_dataset
from raydist.data.remote import local_dataset
from raydist.data.shards import read_split
from raydist.data.synthetic_webdataset import add_member, write_webdataset
from raydist.data.webdataset import webdataset_index


def _tar_members(path: Path) -> dict[str, dict[str, bytes]]:
    """``{key: {extension: bytes}}`` of one tar, read with tarfile alone."""
    out: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            key, _, ext = member.name.partition(".")
            out.setdefault(key, {})[ext] = tar.extractfile(member).read()
    return out


def _hash_id(split: str, key: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{split}/{key}".encode(), digest_size=8).digest(), "big") >> 1


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYDIST_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("labels", [False, True], ids=["pairs", "labels"])
def test_the_index_holds_every_sample_as_the_tar_does(tmp_path, labels):
    source = write_webdataset(tmp_path / "wds", labels=labels, per_split={"train": 60, "val": 12, "test": 12})
    folder = local_dataset(source)
    manifest = load_manifest(folder)
    assert manifest.task == ("labels" if labels else "pairs") and manifest.image_format == "encoded"
    assert manifest.image_size == [16, 16] and manifest.image_channels == 3
    assert {s: manifest.splits[s].rows for s in manifest.splits} == {"train": 60, "val": 12, "test": 12}
    assert [s.file for s in manifest.splits["train"].shards] == [f"train/{i:05d}.tar" for i in range(3)]
    for split in ("train", "val", "test"):
        expected = {}
        for shard in sorted((source / split).glob("*.tar")):
            expected.update(_tar_members(shard))
        table = read_split(folder, split)  # verify=True: sha256, schema, every image decoded
        rows = {sid: r for r, sid in enumerate(table.column("sample_id").to_pylist())}
        assert sorted(rows) == sorted(_hash_id(split, k) for k in expected)
        for key, members in expected.items():
            r = rows[_hash_id(split, key)]
            image = next(members[e] for e in ("jpg", "png", "webp") if e in members)
            assert table.column("image")[r].as_py() == image
            if labels:
                assert table.column("label")[r].as_py() == int(members["cls"])
            else:
                assert table.column("captions")[r].as_py() == [members["txt"].decode()]
    if labels:
        assert manifest.num_classes == 4
    else:
        assert {"red", "green", "blue", "yellow", "square"} <= set(
            (folder / "vocab.json").read_text().replace('"', " ").split()
        )
    assert validate_dataset(folder).ok


def test_the_index_is_reused_until_a_shard_changes(tmp_path):
    source = write_webdataset(tmp_path / "wds", per_split={"train": 24, "val": 6, "test": 6})
    first = webdataset_index(source)
    stamp = (first / "manifest.json").stat().st_mtime_ns
    assert webdataset_index(source) == first and (first / "manifest.json").stat().st_mtime_ns == stamp
    with tarfile.open(source / "val" / "00000.tar", "a") as tar:
        add_member(tar, "extra.txt", b"a caption without an image")
    with pytest.raises(ValueError, match=r"val/00000.tar: key extra: no image"):
        webdataset_index(source)


def _refusal(folder: Path) -> str:
    with pytest.raises(ValueError) as refused:
        webdataset_index(folder)
    return str(refused.value)


def _rewrite(shard: Path, drop: str | None = None, change: tuple[str, bytes] | None = None) -> None:
    """Rewrite a tar without the member ``drop`` or with member ``change[0]`` holding ``change[1]``."""
    with tarfile.open(shard) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(shard, "w") as tar:
        for name, data in members:
            if name != drop:
                add_member(tar, name, change[1] if change and name == change[0] else data)


def test_defects_are_refused_naming_the_shard_and_the_key(tmp_path):
    pairs = write_webdataset(tmp_path / "pairs", per_split={"train": 24, "val": 6, "test": 6})
    _rewrite(pairs / "train" / "00000.tar", drop="000000003.jpg")
    _rewrite(pairs / "train" / "00000.tar", change=("000000004.txt", b"   "))
    _rewrite(pairs / "val" / "00000.tar", drop="000000026.txt")
    refusal = _refusal(pairs)
    assert (
        "train/00000.tar: key 000000003: no image (expected 000000003.jpg, .png or .webp; found .json, .txt)"
        in (refusal)
    )
    assert "train/00000.tar: key 000000004: no caption (000000004.txt missing or empty)" in refusal
    assert "val/00000.tar: key 000000026: no caption" in refusal

    labels = write_webdataset(tmp_path / "labels", labels=True, per_split={"train": 24, "val": 6, "test": 6})
    _rewrite(labels / "test" / "00000.tar", change=("000000031.cls", b"red"))
    assert "test/00000.tar: key 000000031: no class (000000031.cls missing or not an integer >= 0)" in (
        _refusal(labels)
    )

    twice = write_webdataset(tmp_path / "twice", per_split={"train": 24, "val": 6, "test": 6})
    with tarfile.open(twice / "train" / "00000.tar", "a") as tar:
        data = _tar_members(twice / "train" / "00000.tar")["000000001"]
        for ext, raw in data.items():
            add_member(tar, f"000000001.{ext}", raw)
    assert "key 000000001: the key is in train/ twice" in _refusal(twice)

    broken = write_webdataset(tmp_path / "broken", per_split={"train": 24, "val": 6, "test": 6})
    (broken / "val" / "00000.tar").write_bytes(b"<html>not a tar</html>" * 40)
    assert "val/00000.tar: not a readable tar shard" in _refusal(broken)

    empty = write_webdataset(tmp_path / "empty", per_split={"train": 24, "val": 6, "test": 6})
    for path in (empty / "test").glob("*.tar"):
        path.unlink()
    assert "no *.tar shards in test/" in _refusal(empty)


def test_validate_names_an_image_that_does_not_decode_by_shard_and_key(tmp_path, capsys):
    """The index decodes a sample of the train images; `raydist validate` decodes every image (or a sample)."""
    source = write_webdataset(tmp_path / "wds", per_split={"train": 24, "val": 6, "test": 6})
    image = _tar_members(source / "test" / "00000.tar")["000000030"]["jpg"]
    _rewrite(source / "test" / "00000.tar", change=("000000030.jpg", image[: len(image) // 2]))
    assert main(["validate", str(source)]) == 1
    out = capsys.readouterr().out
    assert "test/00000.tar" in out and "key 000000030: truncated" in out, out


@pytest.mark.parametrize(
    "name, link, why",
    [
        ("../000000002.txt", None, "a path with '..'"),
        ("a/../../000000002.txt", None, "a path with '..'"),
        ("/etc/000000002.txt", None, "an absolute path"),
        ("000000002.txt", tarfile.SYMTYPE, "a link (to '/etc/passwd')"),
        ("000000002.txt", tarfile.LNKTYPE, "a link (to '/etc/passwd')"),
    ],
    ids=["dotdot", "inner-dotdot", "absolute", "symlink", "hardlink"],
)
def test_a_member_that_escapes_the_shard_is_refused_naming_the_shard_and_the_key(tmp_path, name, link, why):
    folder = write_webdataset(tmp_path / "wds", per_split={"train": 24, "val": 6, "test": 6})
    shard = folder / "train" / "00000.tar"
    with tarfile.open(shard, "a") as tar:
        if link is None:
            add_member(tar, name, b"a caption")
        else:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = link, "/etc/passwd"
            tar.addfile(info)
    key = name.rpartition(".")[0]
    assert f"train/00000.tar: key {key}: member {name!r} refused: {why}" in _refusal(folder)
