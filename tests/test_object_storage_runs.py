"""Runs whose data and run folder live on an S3-compatible server (moto on loopback, tests/object_store.py):
`raydist train` with two Ray Train workers from ``s3://`` data into ``s3://`` storage finishes with test
metrics, and its run evaluates and loads from the URI as from a plain download of it; Ctrl-C on such a run
checkpoints and exits 130, and the printed command resumes it to the end (the one Ctrl-C drill of Ray workers); a missing bucket is one line, exit 2;
WebDataset shards (image–caption and labelled) train from a local folder and from the server.
Every `raydist train` here starts a private Ray instance: cluster step."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import boto3
import numpy as np
import pytest
from object_store import upload

from raydist.checkpoint import STATE_FILE, load_checkpoint
from raydist.cli import main
from raydist.data import ensure_default_dataset
from raydist.data.synthetic_webdataset import write_webdataset
from raydist.retrieval.embedder import Embedder
from raydist.runfiles import LOG_FILE
from raydist.uris import cache_path

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TRAIN_ROWS = (
    0.05  # data.train_fraction of the embedded set's 15,000 train rows: about 23 steps of 32 rows an epoch
)


def _env() -> dict[str, str]:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    return env


def _train(data: str, storage: str, name: str, *extra: str) -> list[str]:
    return [
        "raydist",
        "train",
        "--preset",
        "tiny",
        "--data",
        data,
        "--storage",
        storage,
        "--name",
        name,
        f"data.train_fraction={TRAIN_ROWS}",
        *extra,
    ]


def _run(argv: list[str], *, ok: bool = True) -> subprocess.CompletedProcess:
    """Run a `raydist` command line (private Ray, this process's AWS environment); with ``ok``, require exit 0."""
    done = subprocess.run(argv, env=_env(), check=False, capture_output=True, text=True, timeout=600)
    if ok:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _download(uri: str, dest: Path) -> Path:
    """A plain boto3 download of a folder URI (independent of raydist's copying code)."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    client = boto3.client("s3")
    for item in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", []):
        if item["Key"].endswith("/"):
            continue
        target = dest / item["Key"][len(prefix) + 1 :]
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, item["Key"], str(target))
    return dest


def _printed(text: str, label: str) -> str:
    lines = [line[len(label) :].strip() for line in text.splitlines() if line.startswith(label)]
    assert len(lines) == 1, f"expected one {label!r} line in:\n{text}"
    return lines[0]


@pytest.mark.timeout(900)
def test_a_run_from_s3_data_into_s3_storage_trains_evaluates_and_loads(s3_server, tmp_path, capsys):
    data = upload(ensure_default_dataset(), s3_server.create_bucket("shards") + "/embedded")
    storage = s3_server.create_bucket("runs") + "/exp"
    done = _run(_train(data, storage, "x", "train.epochs=2"))
    assert "== test split, best checkpoint ==" in done.stdout
    assert _printed(done.stdout, "run folder:") == f"{storage}/x"
    best = _printed(done.stdout, "best checkpoint:")
    assert best.startswith(f"{storage}/x/checkpoint_")
    record = json.loads(
        boto3.client("s3").get_object(Bucket="runs", Key="exp/x/best_checkpoint.json")["Body"].read()
    )
    assert record["checkpoint"] == best.rsplit("/", 1)[1] and record["metric"] == "val/rsum"
    history = json.loads(
        boto3.client("s3").get_object(Bucket="runs", Key="exp/x/history.json")["Body"].read()
    )
    assert [m["epoch"] for m in history] == [1, 2]

    capsys.readouterr()
    assert main(["eval", "--checkpoint", f"{storage}/x", "--split", "test"]) == 0
    out = capsys.readouterr().out
    assert f"best by val/rsum = {record['value']:.4g}" in out.splitlines()[0]
    downloaded = _download(best, tmp_path / "best")
    assert main(["eval", "--checkpoint", str(downloaded), "--split", "test"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == out.splitlines()[1:]  # the same test metrics
    texts = ["a white child sitting in the park", "a red car"]
    np.testing.assert_array_equal(
        Embedder.from_checkpoint(f"{storage}/x").embed_texts(texts),
        Embedder.from_checkpoint(downloaded).embed_texts(texts),
    )

    missing = _run(_train("s3://no-such-bucket/embedded", storage, "y"), ok=False)
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        "raydist: error: s3://no-such-bucket/embedded: bucket 'no-such-bucket' does not exist "
        "(or these credentials cannot see it)"
    )


@pytest.mark.timeout(900)
def test_ctrl_c_on_two_ray_workers_in_s3_checkpoints_exits_130_and_the_printed_command_resumes(
    s3_server, tmp_path
):
    """`raydist train` with two Ray Train workers, its data and run folder on the server; Ctrl-C (SIGINT to its
    process group, as a terminal sends it) after a few steps: the workers stop at a step boundary (they read the
    stop file from the bucket), exit 130, the checkpoint in the bucket and the resume command printed once, the
    worker's line in the run's log; the printed command finishes the run (epochs end at the same steps as an
    uninterrupted run's), and the first command again is refused as finished (the named run found in the bucket).
    The in-process drill (tests/test_train_stopping.py) checks every step logged exactly once and the same
    parameters as an uninterrupted run; tests/test_train_faults.py resumes two Ray workers exactly."""
    data = upload(ensure_default_dataset(), s3_server.create_bucket("cut-shards") + "/embedded")
    storage = s3_server.create_bucket("cut-runs") + "/exp"
    command = _train(data, storage, "cut", "train.epochs=2", "train.log_every=1", "debug.step_delay_s=0.2")
    log = tmp_path / "first.log"
    with open(log, "w") as out:
        first = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(),
            start_new_session=True,
        )
        try:
            deadline = time.time() + 500
            while "epoch 1/2 step 3/" not in log.read_text():
                assert first.poll() is None, log.read_text()[-3000:]
                assert time.time() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
            os.killpg(first.pid, signal.SIGINT)
            code = first.wait(180)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
    text = log.read_text()
    assert code == 130, text[-3000:]
    assert "SIGINT: stopping at the next step boundary" in text
    checkpoint = _printed(text, "checkpoint:")
    assert checkpoint.startswith(f"{storage}/cut/checkpoint_")
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="cut-runs")["Contents"]]
    assert "exp/cut/stop-requested" not in keys and f"{checkpoint.split('/', 3)[3]}/{STATE_FILE}" in keys
    stopped_at = load_checkpoint(_download(checkpoint, tmp_path / "cut"))[0]["loop"]["global_step"]
    assert "stopped on request" in (cache_path(f"{storage}/cut") / LOG_FILE).read_text()  # the worker's line
    resume = _printed(text, "resume with:")
    assert resume == f"raydist train --resume {checkpoint}"

    outcome = tmp_path / "resumed.json"
    resumed = _run([*shlex.split(resume), "--json", str(outcome)])
    result = json.loads(outcome.read_text())
    steps = result["history"][0]["step"]  # an epoch of the train rows data.train_fraction keeps
    assert [(m["epoch"], m["step"]) for m in result["history"]] == [(1, steps), (2, 2 * steps)]
    assert 3 <= stopped_at < 2 * steps and result["resumed_at"] == [stopped_at], result["resumed_at"]
    epoch = (stopped_at - 1) // steps + 1
    assert f"stopped on request at epoch {epoch}/2, step {stopped_at}: checkpoint saved" in text
    assert resumed.stdout.count(f"resumed from {checkpoint} at epoch {epoch}, step {stopped_at}") == 1, (
        resumed.stdout
    )
    assert result["run_dir"] == f"{storage}/cut" and result["test_metrics"]["rsum"] > 0
    again = _run(command, ok=False)
    assert again.returncode == 2 and "is finished" in again.stderr, again.stderr


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("labels", "on_server"), [(False, True), (True, False)], ids=["pairs-s3", "labels-local"]
)
def test_webdataset_shards_train_end_to_end(s3_server, tmp_path, labels, on_server):
    """Tars in img2dataset's layout, in a local folder or uploaded as they are: `raydist train --data DIR|s3://…`
    indexes them (a URI's after copying them), two Ray Train workers train (the image–caption train split streamed
    by Ray Data from where the tars are, the labelled one read into memory), and the test split is evaluated; the
    labelled model learns the colour (4 classes: chance 25 %). Each value of each axis runs once (a whole
    `raydist train` with a private Ray instance per case): image–caption tars streamed from the server, labelled
    tars read into memory from a folder (the two cases left out take the same paths: a URI's tars are copied
    and indexed as a folder's, and Ray Data streams a folder's tars as it does a URI's; the index itself, for
    both tasks, is tested without Ray in tests/test_data_webdataset.py)."""
    shards = write_webdataset(
        tmp_path / "wds", labels=labels, per_split={"train": 192, "val": 32, "test": 32}
    )
    data = str(shards)
    if on_server:
        data = upload(shards, s3_server.create_bucket(f"wds-{'labels' if labels else 'pairs'}") + "/shards")
    memory = "data.in_memory_max_mb=512" if labels else "data.in_memory_max_mb=0"  # pairs: streamed
    extra = ("train.epochs=4", "train.min_steps=0", "data.train_fraction=1", memory)
    done = _run(_train(data, str(tmp_path / "runs"), "wds", *extra))
    outcome = done.stdout.split("== test split, best checkpoint ==")[1]
    if labels:
        top1 = float(next(line.split()[1] for line in outcome.splitlines() if line.startswith("top1")))
        assert top1 >= 60, done.stdout[-2000:]
    else:
        assert "rsum" in outcome
