"""Benchmark "webdataset": images/s of training views into a worker from WebDataset tar shards against Parquet
shards of the same images (the same bytes, ids and labels; the same decode and views: the streamed path, Ray Data
tasks), and what the same datasets cost on first use from a local S3-compatible server (moto on loopback: the
copy into the cache, and for the tars their index) against local disk."""

from __future__ import annotations

import math
import os
import tempfile
import time
from pathlib import Path

from raydist.benchmarks.catalog import register_benchmark
from raydist.benchmarks.harness import ray_instance, row
from raydist.benchmarks.images import PROCESSES, WARMUP_EPOCHS, EpochClock, steady_label
from raydist.config import load_config
from raydist.data import dataset_task, load_manifest, read_split
from raydist.data.remote import local_dataset
from raydist.data.schema import SPLITS
from raydist.data.shards import DatasetWriter
from raydist.data.stream import StreamedEpochs, train_streams
from raydist.data.synthetic_webdataset import write_webdataset
from raydist.tasks import DataInfo, build_task
from raydist.train.plan import step_plan
from raydist.uris import CACHE_ENV, write_bytes

# (train images, side in pixels, crop) of the generated JPEG/PNG/WebP samples; val and test are an eighth each
FULL_DATA, SMOKE_DATA = (3000, 64, 48), (48, 16, 12)
PER_SHARD = 500


def parquet_twin(indexed: Path, out: Path) -> Path:
    """The indexed WebDataset's splits as a Parquet dataset of encoded images: the same image bytes, ids, labels."""
    manifest = load_manifest(indexed)
    with DatasetWriter(out, task=manifest.task, num_classes=manifest.num_classes) as writer:
        for split in SPLITS:
            table = read_split(indexed, split, verify=False)
            ids = table.column("sample_id").to_numpy()
            writer.add_split(
                split, ids, ids, table.column("image").to_pylist(), labels=table.column("label").to_numpy()
            )
    return out


def streamed(data: Path, crop: int, batch: int, passes: int) -> EpochClock:
    """Images/s of the train split's views streamed to one worker (Ray Data tasks decode and make the views)."""
    overrides = {
        "data.path": str(data),
        "model.image_encoder": "small-cnn",
        "data.image_size": crop,
        "train.num_workers": 1,
        "train.batch_size": batch,
    }
    cfg = load_config("default", overrides=overrides, task_of=dataset_task)
    task = build_task(cfg, DataInfo.from_dataset(data))
    datasets, views = train_streams(
        data,
        task.columns,
        task.stream_transform(),
        task.epoch_transform(),
        epochs=passes,
        num_cpus=1,
        concurrency=PROCESSES,
    )
    stream = StreamedEpochs(
        [ds.streaming_split(1, equal=True)[0] for ds in datasets.values()],
        rows=step_plan(cfg, task.info.task).rows_per_worker,
        shuffle_buffer=cfg.data.shuffle_buffer,
        seed=0,
        rank=0,
        epochs=passes,
        views=list(views.values()),
    )
    clock = EpochClock()
    clock.run(lambda e: (b["image"] for b in stream.epoch(e)), passes)
    return clock


def upload(folder: Path, uri: str) -> int:
    """Write every file of ``folder`` under ``uri``; the bytes written."""
    total = 0
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        write_bytes(f"{uri}/{path.relative_to(folder).as_posix()}", data)
        total += len(data)
    return total


def first_use_from_s3(folders: dict[str, Path], root: Path) -> dict[str, tuple[float, float, int]]:
    """Per folder: seconds of the first ``local_dataset(s3://…)`` (copy, and index for the tars), of a second one
    (the copy reused), and the bytes stored; on moto's S3 server on loopback."""
    from raydist.local_s3 import create_bucket, local_s3_server

    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    saved.update(
        {k: os.environ.get(k) for k in ("AWS_DEFAULT_REGION", "AWS_EC2_METADATA_DISABLED", CACHE_ENV)}
    )
    out = {}
    with local_s3_server(root / "moto.log") as env:
        os.environ.update({**env, CACHE_ENV: str(root / "cache")})
        try:
            create_bucket("bench")
            for name, folder in folders.items():
                stored = upload(folder, f"s3://bench/{name}")
                start = time.perf_counter()
                local_dataset(f"s3://bench/{name}")
                first = time.perf_counter() - start
                start = time.perf_counter()
                local_dataset(f"s3://bench/{name}")
                out[name] = (first, time.perf_counter() - start, stored)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return out


def folder_mib(folder: Path) -> float:
    """MiB of the files under ``folder`` (img2dataset's side files of the tars included)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


@register_benchmark("webdataset", order=16, ray=True)
def webdataset_rate(*, smoke: bool, repeats: int) -> str:
    """Images/s into a worker from WebDataset tars vs Parquet shards of the same images; first use from S3 vs disk."""
    images, side, crop = SMOKE_DATA if smoke else FULL_DATA
    passes = 1 if smoke else WARMUP_EPOCHS + 2 * math.ceil(repeats / 2)
    batch = 8 if smoke else 128
    with tempfile.TemporaryDirectory(prefix="raydist-bench-wds-") as tmp:
        root = Path(tmp)
        saved_cache = os.environ.get(CACHE_ENV)
        os.environ[CACHE_ENV] = str(root / "cache-local")
        try:
            tars = write_webdataset(
                root / "tars",
                labels=True,
                per_split={"train": images, "val": images // 8, "test": images // 8},
                per_shard=max(images // 6, 8) if smoke else PER_SHARD,
                side=side,
            )
            start = time.perf_counter()
            indexed = local_dataset(tars)
            index_s = time.perf_counter() - start
        finally:
            if saved_cache is None:
                os.environ.pop(CACHE_ENV, None)
            else:
                os.environ[CACHE_ENV] = saved_cache
        parquet = parquet_twin(indexed, root / "parquet")
        with ray_instance():
            clocks = {
                "parquet": streamed(parquet, crop, batch, passes),
                "tars": streamed(indexed, crop, batch, passes),
            }
        remote = first_use_from_s3({"parquet": parquet, "tars": tars}, root)
        stored = {"parquet": folder_mib(parquet), "tars": folder_mib(tars)}
    base = clocks["parquet"].steady
    lines = [
        (
            f"{images} train images ({side}×{side} JPEG, PNG and WebP in turn, 4 classes), views {crop}×{crop} (random "
            f"resized crop, flip, normalise) streamed to one worker by {PROCESSES} Ray Data tasks; steady rate over "
            f"{steady_label(passes)} of {passes}. The Parquet shards hold the same image bytes, ids and labels as the "
            "tars. First use: local_dataset(...) before training (tars: their index; s3://: the copy into the cache, "
            "and the index for the tars), then again (reused); moto's S3 server on 127.0.0.1."
        ),
        "",
        "| shards | stored MiB | streamed views/s (steady) | per epoch | vs Parquet |",
        "|---|---|---|---|---|",
    ]
    for name, label in (("parquet", "Parquet"), ("tars", "WebDataset tars")):
        clock = clocks[name]
        lines.append(
            row(
                label,
                f"{stored[name]:.1f}",
                f"{clock.steady:.0f}",
                ", ".join(f"{r:.0f}" for r in clock.rates),
                f"{clock.steady / base:.2f}×",
            )
        )
    lines += [
        "",
        "| shards | first use, local disk | first use, s3:// (copy) | MiB/s of the copy | again, s3:// |",
        "|---|---|---|---|---|",
    ]
    for name, label, local_s in (("parquet", "Parquet", 0.0), ("tars", "WebDataset tars", index_s)):
        first, again, stored = remote[name]
        lines.append(
            row(
                label,
                f"{local_s:.2f} s" + (" (index)" if name == "tars" else " (nothing to do)"),
                f"{first:.2f} s",
                f"{stored / 2**20 / first:.0f}",
                f"{again:.2f} s",
            )
        )
    return "\n".join(lines)
