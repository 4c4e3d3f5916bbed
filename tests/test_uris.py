"""Paths that are URIs, against a real S3-compatible server on loopback (moto, tests/object_store.py): files read
and written through pyarrow as boto3 sees them; a dataset URI's local copy is the uploaded folder byte for byte
and is copied again only when the stored manifest changes; a run folder on the server chooses and loads the same
checkpoint, with the same embeddings, as the local folder it was uploaded from; a stop file on the server is
seen; and bad locations (no bucket, no prefix, an endpoint nothing listens on, refused credentials) are
refused in one line naming the URI, before Ray starts."""

from __future__ import annotations

import filecmp
import os
import re
import signal
import time
from pathlib import Path

import boto3
import numpy as np
import pytest
from object_store import free_port, upload

from raydist.checkpoint import has_state
from raydist.checkpoint.remote import remote_checkpoints
from raydist.cli import main
from raydist.data import make_synthetic, validate_dataset
from raydist.data.remote import local_dataset
from raydist.local_s3 import local_s3_server
from raydist.retrieval.embedder import Embedder
from raydist.retrieval.trained import choose_trained
from raydist.train.stopping import StopFileHook, stop_on_signals
from raydist.uris import (
    StorageError,
    cache_path,
    check_bucket,
    delete,
    file_sizes,
    file_type,
    list_folder,
    location_of,
    read_bytes,
    write_bytes,
)


def _keys(bucket: str, prefix: str = "") -> list[str]:
    """The object keys boto3 lists (independent of raydist's reading code), without the empty ``folder/``
    markers pyarrow leaves so that a folder it deleted from stays listed."""
    found = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"] for o in found if not o["Key"].endswith("/"))


def _same_tree(a: Path, b: Path) -> None:
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    _, mismatch, errors = filecmp.cmpfiles(a, b, [str(f) for f in files], shallow=False)
    assert not mismatch and not errors


def test_files_on_the_server_read_and_write_as_boto3_sees_them(s3_server):
    bucket = s3_server.create_bucket("round-trip")
    write_bytes(f"{bucket}/run/a.txt", b"alpha")
    write_bytes(f"{bucket}/run/sub/b.bin", bytes(range(256)) * 40)
    assert _keys("round-trip") == ["run/a.txt", "run/sub/b.bin"]
    body = boto3.client("s3").get_object(Bucket="round-trip", Key="run/sub/b.bin")["Body"].read()
    assert read_bytes(f"{bucket}/run/sub/b.bin") == body == bytes(range(256)) * 40
    assert list_folder(f"{bucket}/run") == {"a.txt": "file", "sub": "folder"}
    assert file_sizes(f"{bucket}/run") == {"a.txt": 5, "sub/b.bin": 10240}
    assert [file_type(f"{bucket}/run{p}") for p in ("", "/a.txt", "/nothing")] == [
        "folder",
        "file",
        "missing",
    ]
    delete(f"{bucket}/run/sub")
    assert _keys("round-trip") == ["run/a.txt"] and list_folder(f"{bucket}/missing") == {}


def test_ray_train_locations_become_uris():
    import pyarrow.fs

    assert location_of(pyarrow.fs.LocalFileSystem(), "/tmp/runs/x") == "/tmp/runs/x"
    assert location_of(pyarrow.fs.S3FileSystem(anonymous=True), "bucket/runs/x") == "s3://bucket/runs/x"


def test_bad_locations_are_one_line_naming_the_uri(s3_server, monkeypatch):
    bucket = s3_server.create_bucket("present")
    refusals = {
        "s3://absent/data": "s3://absent/data: bucket 'absent' does not exist",
        f"{bucket}/nothing": f"{bucket}/nothing: not found; expected a dataset folder with manifest.json",
    }
    for uri, start in refusals.items():
        with pytest.raises(StorageError) as refused:
            local_dataset(uri)
        assert str(refused.value).startswith(start) and "\n" not in str(refused.value)
    write_bytes(f"{bucket}/junk/manifest.json", b"{not json")
    with pytest.raises(ValueError, match=r"s3://present/junk/manifest.json: not valid JSON"):
        local_dataset(f"{bucket}/junk")
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    with pytest.raises(StorageError) as refused:
        local_dataset("s3://present/data")
    line = str(refused.value)
    assert (
        line.startswith(f"s3://present/data/manifest.json: cannot read it (endpoint {closed};")
        and "\n" not in line
    )


def test_refused_credentials_are_one_line_naming_the_uri(tmp_path, monkeypatch):
    """A server that checks credentials (moto with INITIAL_NO_AUTH_ACTION_COUNT=0: every key is unknown)."""
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "0")
    with local_s3_server(tmp_path / "moto.log") as env:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        for refused in (lambda: local_dataset("s3://data/pairs"), lambda: check_bucket("s3://runs/exp")):
            with pytest.raises(StorageError) as error:
                refused()
            line = str(error.value)
            assert "\n" not in line and "ACCESS_DENIED" in line, line
            assert line.startswith(
                ("s3://data/pairs/manifest.json: cannot read it", "s3://runs/exp: cannot read it")
            )


def test_a_dataset_uri_is_copied_once_and_again_when_its_manifest_changes(s3_server, small_pairs, tmp_path):
    uri = upload(small_pairs, s3_server.create_bucket("datasets") + "/pairs")
    copy = local_dataset(uri)
    _same_tree(Path(small_pairs), copy)
    assert validate_dataset(copy).ok
    shard = next(copy.glob("train/*.parquet"))
    stamp = shard.stat().st_mtime_ns
    assert local_dataset(uri + "/") == copy and shard.stat().st_mtime_ns == stamp  # reused, not copied again

    other = make_synthetic(tmp_path / "other", images=40, captions_per_image=5, dim=16, seed=9)
    for key in _keys("datasets", "pairs/"):
        boto3.client("s3").delete_object(Bucket="datasets", Key=key)
    upload(other, uri)
    assert local_dataset(uri) == copy
    _same_tree(Path(other), copy)


def test_shards_at_odds_with_the_manifest_are_refused_from_their_footers_before_any_copy(
    s3_server, small_pairs, tmp_path
):
    """The footer of each stored shard (one range request) against the manifest: a shard missing, one that is not
    Parquet, one with other rows; nothing is copied."""
    bucket = s3_server.create_bucket("footers")
    shards = sorted(p.relative_to(small_pairs).as_posix() for p in Path(small_pairs).glob("*/*.parquet"))
    other = make_synthetic(tmp_path / "other", images=40, captions_per_image=5, dim=16, seed=9)
    cases = {
        "missing": (None, r"shard listed in manifest.json is missing"),
        "junk": (b"PAR1 but not really", r"not a readable Parquet file"),
        "rows": (
            next(Path(other).glob("train/*.parquet")).read_bytes(),
            r"200 rows, but manifest.json says \d+",
        ),
    }
    for name, (replacement, refusal) in cases.items():
        uri = upload(small_pairs, f"{bucket}/{name}")
        key = f"{name}/{shards[0]}"
        if replacement is None:
            boto3.client("s3").delete_object(Bucket="footers", Key=key)
        else:
            boto3.client("s3").put_object(Bucket="footers", Key=key, Body=replacement)
        with pytest.raises(ValueError, match=rf"^{re.escape(f'{uri}/{shards[0]}')}: {refusal}"):
            local_dataset(uri)
        assert not cache_path(uri).exists()


def _train_in_process(data: Path, runs: Path, name: str) -> None:
    args = ["train", "--preset", "tiny", "--data", str(data), "--storage", str(runs), "--name", name]
    assert (
        main(
            [
                *args,
                "train.num_workers=0",
                "train.epochs=2",
                "data.train_fraction=0.25",
                "train.tensorboard=false",
            ]
        )
        == 0
    )


def test_a_run_on_the_server_loads_as_the_local_run_it_was_uploaded_from(
    s3_server, small_pairs, tmp_path, capsys
):
    runs = tmp_path / "runs"
    _train_in_process(small_pairs, runs, "local")
    uri = upload(runs / "local", s3_server.create_bucket("runs") + "/exp/local")
    local_best, remote_best = choose_trained(runs / "local"), choose_trained(uri)
    assert remote_best.path.name == local_best.path.name and remote_best.reason == local_best.reason
    assert remote_best.reason.startswith("best by val/rsum")
    newest = remote_checkpoints(uri)[-1]
    assert choose_trained(uri, latest=True).path.name == newest
    given = choose_trained(f"{uri}/{newest}")
    assert given.reason == "the checkpoint given" and has_state(given.path)

    texts = ["a white child sitting in the park", "two dogs"]
    local_emb = Embedder.from_checkpoint(runs / "local").embed_texts(texts)
    np.testing.assert_array_equal(Embedder.from_checkpoint(uri).embed_texts(texts), local_emb)

    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(runs / "local"), "--split", "test"]) == 0
    local_out = capsys.readouterr().out.splitlines()
    assert main(["eval", "--checkpoint", uri, "--split", "test"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == local_out[1:]  # the same metrics table
    data = upload(small_pairs, s3_server.create_bucket("eval-data") + "/pairs")
    assert main(["eval", "--checkpoint", uri, "--data", data, "--split", "test"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == local_out[1:]  # and on the dataset's URI

    kept = remote_checkpoints(uri)
    for key in _keys("runs", f"exp/local/{kept[0]}/"):  # the store prunes the older checkpoint
        boto3.client("s3").delete_object(Bucket="runs", Key=key)
    copy = choose_trained(uri, latest=True).path.parent
    assert sorted(p.name for p in copy.glob("checkpoint_*")) == kept[1:]


def test_a_stop_file_on_the_server_is_written_on_a_signal_and_seen(s3_server):
    stop = s3_server.create_bucket("control") + "/run/stop-requested"
    write_bytes(stop, b"")  # left by an earlier stopped attempt: must not stop this one
    hook = StopFileHook(stop)
    with stop_on_signals(stop) as signals:
        assert _keys("control") == [] and not hook.stop_requested(None)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the handler runs on the main thread at its next bytecode
        assert signals.count == 1 and _keys("control") == ["run/stop-requested"]
        assert StopFileHook(stop).stop_requested(None)
    assert _keys("control") == []


def test_the_cli_refuses_bad_locations_before_ray_starts(s3_server, small_pairs, capsys):
    """Unmarked (not slow): tests/conftest.py fails the test if any of these reaches ray.init."""
    bucket = s3_server.create_bucket("cli")
    runs = [
        (
            ["train", "--preset", "tiny", "--data", "s3://no-such-bucket/pairs"],
            "s3://no-such-bucket/pairs: bucket",
        ),
        (["train", "--preset", "tiny", "--data", f"{bucket}/empty"], f"{bucket}/empty: not found"),
        (
            ["train", "--preset", "tiny", "--data", str(small_pairs), "--storage", "s3://no-runs-bucket/exp"],
            "s3://no-runs-bucket/exp: bucket 'no-runs-bucket' does not exist",
        ),
        (["eval", "--checkpoint", f"{bucket}/runs/none"], f"{bucket}/runs/none: not found"),
    ]
    for argv, start in runs:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"raydist: error: {start}") and "\n" not in err, err
