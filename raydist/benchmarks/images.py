"""Benchmark of the image path ("images"): images/s that reach a worker as training views (random resized crop,
flip, normalise) when Ray Data tasks decode the shards (the streamed path: ``read_parquet`` → decode in
``map_batches`` → the worker's per-epoch views), when the worker holds the split decoded in memory (the
in-memory path: views only), and what one worker's training step with ``small-cnn`` consumes."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from raydist.benchmarks.harness import median, ray_instance, row, spread
from raydist.config import load_config
from raydist.data import dataset_task
from raydist.data.convert_images import convert_image_folder
from raydist.data.stream import InMemoryBatches, StreamedEpochs, train_arrays, train_dataset
from raydist.distributed import StepPlan
from raydist.tasks import DataInfo, StepContext, build_task
from raydist.train.loop import Trainables, train_step

# (classes, images per class, side in pixels) of the generated PNGs; the crop is CROP px
FULL_DATA, SMOKE_DATA = (10, 200, 96), (2, 8, 24)
FULL_CROP, SMOKE_CROP = 64, 16
FULL_STEPS, SMOKE_STEPS = 10, 1


def write_images(root: Path, smoke: bool) -> Path:
    """An ImageFolder tree of random-texture PNGs (a colour per class, noise per image), converted to an
    encoded labels dataset."""
    from PIL import Image

    classes, per_class, side = SMOKE_DATA if smoke else FULL_DATA
    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = root / "src" / f"class{c:02d}"
        folder.mkdir(parents=True)
        base = rng.integers(0, 256, 3)
        for k in range(per_class):
            pixels = np.clip(base + rng.normal(0, 40, (side, side, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{k:04d}.png")
    return convert_image_folder(root / "src", root / "data", split_by="image", val_fraction=0.1, test_fraction=0.1)


def images_rate(*, smoke: bool, repeats: int) -> str:
    """Images/s of training views into a worker: Ray Data decoding (streamed) vs the in-memory cache vs the step."""
    with tempfile.TemporaryDirectory(prefix="raydist-bench-images-") as tmp, ray_instance():
        data = write_images(Path(tmp), smoke)
        crop = SMOKE_CROP if smoke else FULL_CROP
        cfg = load_config("default", overrides={"data.path": str(data), "model.image_encoder": "small-cnn",
                                                "data.image_size": crop, "train.num_workers": 1,
                                                "train.batch_size": 8 if smoke else 128},
                          task_of=dataset_task)  # fmt: skip
        task = build_task(cfg, DataInfo.from_dataset(data))
        plan = StepPlan.from_config(cfg)
        rows = plan.rows_per_worker
        views = task.epoch_transform()
        shard = train_dataset(data, task.columns, task.stream_transform()).streaming_split(1, equal=True)[0]
        passes = 1 if smoke else repeats
        stream = StreamedEpochs([shard], rows=rows, shuffle_buffer=cfg.data.shuffle_buffer, seed=0, rank=0,
                                epochs=passes + 1, epoch_transform=views)  # fmt: skip
        started = time.perf_counter()
        arrays = train_arrays(data, task.columns, task.transform)  # decoded once (the in-memory path's start)
        decode_once = len(arrays["sample_id"]) / (time.perf_counter() - started)
        memory = InMemoryBatches(arrays, rows=rows, rank=0, world=1, seed=0, epoch_transform=views)
        streamed, in_memory = [], []
        for epoch in range(passes):
            start, n = time.perf_counter(), 0
            for batch in stream.epoch(epoch):
                n += len(batch["image"])
            streamed.append(n / (time.perf_counter() - start))
            start, n = time.perf_counter(), 0
            for batch in memory.epoch(epoch):
                n += len(batch["image"])
            in_memory.append(n / (time.perf_counter() - start))
        batches = list(memory.epoch(0))
        torch.manual_seed(0)
        parts = Trainables.build(cfg, task.build_model(), torch.device("cpu"), steps_per_epoch=len(batches))
        steps = SMOKE_STEPS if smoke else FULL_STEPS
        step_rate = []
        for r in range(passes + 1):
            start = time.perf_counter()
            for s in range(steps):
                train_step(parts, task, batches[s % len(batches)], cfg, plan, StepContext(0, s, 0, 1),
                           torch.device("cpu"), {})  # fmt: skip
            if r:  # the first pass warms up
                step_rate.append(rows * steps / (time.perf_counter() - start))
    n_images = len(arrays["sample_id"])
    rate = "{:.0f}"
    need = median(step_rate)
    table = [
        row("path", "images/s, median (min–max)", "× the step's consumption"),
        "|---|---:|---:|",
        row("streamed: Ray Data read + decode tasks → this process makes the epoch's views", spread(streamed, rate),
            f"{median(streamed) / need:.1f}×"),
        row("in memory: this process makes the epoch's views from its decoded cache", spread(in_memory, rate),
            f"{median(in_memory) / need:.1f}×"),
        row("in memory: decoding the split once (before the first epoch)", f"{decode_once:.0f}", ""),
        row(f"one worker's training step, small-cnn, {rows} images per step", spread(step_rate, rate), "reference"),
    ]  # fmt: skip
    classes, _, side = SMOKE_DATA if smoke else FULL_DATA
    return (
        f"{n_images} train images ({classes} classes, {side}×{side} PNG), training views {crop}×{crop} (random "
        f"resized crop, flip, normalise); {passes} epoch(s) per path, the streamed one opened as training opens "
        "it. The step is one process's forward + backward + update of the labels task (default preset, "
        "small-cnn).\n\n" + "\n".join(table)
    )
