"""CLI data commands end to end: make-data, validate (clean and corrupted), convert vsepp-precomp."""

import json

import numpy as np

from raydist.cli import main
from raydist.data import feature_matrix, load_manifest, read_split, split_arrays


def test_make_data_then_validate(tmp_path, capsys):
    out = tmp_path / "d"
    assert (
        main(
            [
                "make-data",
                "synthetic",
                "--out",
                str(out),
                "--images",
                "40",
                "--val-images",
                "8",
                "--test-images",
                "8",
                "--dim",
                "16",
                "--seed",
                "2",
            ]
        )
        == 0
    )
    m = load_manifest(out)
    assert m.feature_dim == 16 and m.splits["train"].rows == 200
    assert main(["validate", str(out)]) == 0
    shard = out / m.splits["val"].shards[0].file
    shard.write_bytes(shard.read_bytes()[:-20])  # truncate: sha256 and Parquet footer both break
    capsys.readouterr()
    assert main(["validate", str(out)]) == 1
    report = capsys.readouterr().out
    assert str(m.splits["val"].shards[0].file) in report and "sha256" in report


def test_convert_vsepp_precomp_with_split_names(tmp_path):
    src = tmp_path / "precomp"
    src.mkdir()
    rng = np.random.default_rng(0)
    for name, n in (("train", 6), ("dev", 2), ("testall", 3)):
        np.save(src / f"{name}_ims.npy", rng.standard_normal((n, 4)).astype(np.float32))
        (src / f"{name}_caps.txt").write_text("".join(f"a red dog number {i}\n" for i in range(5 * n)))
    out = tmp_path / "out"
    assert (
        main(
            [
                "convert",
                "vsepp-precomp",
                "--src",
                str(src),
                "--out",
                str(out),
                "--min-count",
                "1",
                "--splits",
                "train=train,val=dev,test=testall",
            ]
        )
        == 0
    )
    image_ids, _, feats, caps = split_arrays(out, "test")
    assert len(np.unique(image_ids)) == 3 and len(caps) == 15
    np.testing.assert_array_equal(feats[::5], np.load(src / "testall_ims.npy"))
    assert "number" in json.loads((out / "vocab.json").read_text())["words"]
    assert (
        main(["convert", "vsepp-precomp", "--src", str(src), "--out", str(out), "--splits", "bogus=x"]) == 2
    )


def test_convert_npz_standardize_from_the_command_line(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(90, 3)) * np.array([1e-2, 1.0, 1e3])
    np.savez(tmp_path / "d.npz", X=x, y=np.array(["b", "a", "c"])[np.arange(90) % 3])
    assert main(["convert", "npz", "--src", str(tmp_path / "d.npz"), "--out", str(tmp_path / "raw")]) == 0
    assert "--standardize" in capsys.readouterr().err
    assert (
        main(
            [
                "convert",
                "npz",
                "--src",
                str(tmp_path / "d.npz"),
                "--out",
                str(tmp_path / "std"),
                "--standardize",
            ]
        )
        == 0
    )
    assert capsys.readouterr().err == ""
    manifest = load_manifest(tmp_path / "std")
    assert manifest.class_names == ["a", "b", "c"] and manifest.standardization == "standardization.json"
    train = feature_matrix(read_split(tmp_path / "std", "train").column("image")).astype(np.float64)
    np.testing.assert_allclose(train.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(train.std(axis=0), 1, rtol=1e-4)
