"""Benchmark of the image path ("images"): images/s that reach a worker as training views (random resized crop,
flip, normalise) when Ray Data tasks decode the shards and make the epoch's views (the streamed path:
``read_parquet`` → ``map_batches`` with the pass's epoch from its :class:`raydist.data.epoch_board.EpochBoard`), against a torch
``DataLoader`` whose worker processes decode and make the same views (as many processes as Ray Data's tasks), when the worker holds the split decoded
in memory (the in-memory path: views only), and what one worker's training step with ``small-cnn`` consumes;
with the first batch's wait and the object store's peak use and spilled bytes while the stream runs."""

from __future__ import annotations

import math
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raydist.benchmarks.catalog import register_benchmark
from raydist.benchmarks.harness import median, ray_instance, row, spread
from raydist.config import load_config
from raydist.converters.image_folder import convert_image_folder
from raydist.data import dataset_task, read_split
from raydist.data.stream import InMemoryBatches, StreamedEpochs, train_arrays, train_streams
from raydist.tasks import DataInfo, StepContext, build_task
from raydist.train.loop import Trainables, train_step
from raydist.train.plan import step_plan

# (classes, images per class, side in pixels) of the generated PNGs; the crop is CROP px
FULL_DATA, SMOKE_DATA = (10, 400, 96), (2, 8, 24)
FULL_CROP, SMOKE_CROP = 64, 16
FULL_STEPS, SMOKE_STEPS = 10, 1
PROCESSES = 2  # Ray Data decode tasks at once = DataLoader worker processes (the cores of a small box)


class LoaderSplit(torch.utils.data.Dataset):
    """The train split's encoded images for a torch ``DataLoader``: item ``i`` is row ``i``'s training view of
    ``epoch`` (decoded and transformed in the loader's worker process) and its sample id."""

    def __init__(self, images: list[bytes], sample_ids: np.ndarray, transform: Any) -> None:
        self.images, self.sample_ids, self.transform, self.epoch = images, sample_ids, transform, 0

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        sample_id = int(self.sample_ids[i])
        return self.transform.view(self.images[i], sample_id, self.epoch), sample_id


WARMUP_EPOCHS = 2  # epochs left out of the steady rate: the start, and the pass opened ahead during it


class EpochClock:
    """Times a run of epochs: per-epoch images/s, the wait for the first batch, and the steady rate: all images
    of the :func:`steady_epochs` over their time together. One number however the work overlaps between
    epochs: the stream alternates two splits, each opening the next pass on the other, so its epochs come in
    pairs, one that streams while the next pass is being read ahead (slow) and one mostly read ahead already
    (fast); the steady epochs are whole pairs, since an odd count weighs the slow or the fast ones twice."""

    def __init__(self) -> None:
        self.images: list[int] = []
        self.seconds: list[float] = []
        self.first_batch = float("nan")

    def run(
        self, open_epoch: Callable[[int], Iterable[Any]], epochs: int, cpu: CpuAccount | None = None
    ) -> None:
        """Count the views of ``epochs`` epochs, ``open_epoch(e)`` giving epoch e's batches of views (timed from
        the call: opening a pass can wait for its first block); ``cpu`` accounts for the steady epochs."""
        steady = steady_epochs(epochs)
        for epoch in range(epochs):
            if cpu is not None and epoch == steady.start:
                cpu.start()
            start, n = time.perf_counter(), 0
            for views in open_epoch(epoch):
                if not n and not self.images:
                    self.first_batch = time.perf_counter() - start
                n += len(views)
            self.images.append(n)
            self.seconds.append(time.perf_counter() - start)
            if cpu is not None and epoch == steady.stop - 1:
                cpu.stop()

    @property
    def rates(self) -> list[float]:
        return [n / t for n, t in zip(self.images, self.seconds, strict=False)]

    @property
    def steady(self) -> float:
        images, seconds = self.steady_images_seconds()
        return images / seconds

    def steady_images_seconds(self) -> tuple[int, float]:
        """Images and seconds of the steady epochs."""
        steady = steady_epochs(len(self.images))
        return sum(self.images[steady.start : steady.stop]), sum(self.seconds[steady.start : steady.stop])


def steady_epochs(epochs: int) -> range:
    """The epochs of the steady rate in a run of ``epochs`` epochs: those after the first :data:`WARMUP_EPOCHS`,
    as many whole pairs of them as there are (see :class:`EpochClock`); all epochs when there are too few."""
    if epochs <= WARMUP_EPOCHS:
        return range(epochs)
    pairs = (epochs - WARMUP_EPOCHS) // 2
    return range(WARMUP_EPOCHS, WARMUP_EPOCHS + 2 * pairs if pairs else epochs)


def steady_label(epochs: int) -> str:
    """The steady epochs of a run of ``epochs``, 1-based, for the tables."""
    steady = steady_epochs(epochs)
    return f"epochs {steady.start + 1}–{steady.stop}"


def loader_epochs(
    images: list[bytes],
    sample_ids: np.ndarray,
    transform: Any,
    rows: int,
    passes: int,
    cpu: CpuAccount | None = None,
) -> EpochClock:
    """``passes`` epochs through a shuffling ``DataLoader`` with :data:`PROCESSES` workers (started anew each
    epoch, its default), timed (``cpu``: accounted for, steady epochs)."""
    split = LoaderSplit(images, sample_ids, transform)
    loader = torch.utils.data.DataLoader(
        split,
        batch_size=rows,
        shuffle=True,
        num_workers=PROCESSES,
        generator=torch.Generator().manual_seed(0),
    )

    def epoch_views(epoch: int) -> Iterable[Any]:
        split.epoch = epoch
        return (views for views, _ in loader)

    clock = EpochClock()
    clock.run(epoch_views, passes, cpu)
    return clock


class ObjectStoreWatch:
    """The local Ray instance's object-store use, sampled every ``period`` s in a thread while the ``with``
    block runs: ``peak_mib`` and ``spilled_mib`` at the end (Ray's own store statistics, as ``ray memory
    --stats-only`` prints them; None where this Ray does not report them)."""

    def __init__(self, period: float = 0.25) -> None:
        self.period, self.peak_mib, self.spilled_mib = period, None, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def sample() -> tuple[int, int] | None:
        """(MiB in the object store, MiB spilled so far), or None."""
        import ray

        try:
            from ray._private.internal_api import memory_summary

            text = memory_summary(ray.get_runtime_context().gcs_address, stats_only=True)
        except (ImportError, AttributeError, RuntimeError, ValueError):  # a private API: figures left out
            return None
        used, spilled = (
            re.search(r"Plasma memory usage (\d+) MiB", text),
            re.search(r"Spilled (\d+) MiB", text),
        )
        return (int(used.group(1)) if used else 0), (int(spilled.group(1)) if spilled else 0)

    def _record(self) -> None:
        got = self.sample()
        if got is not None:
            self.peak_mib = max(self.peak_mib or 0, got[0])
            self.spilled_mib = got[1]

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._record()

    def __enter__(self) -> ObjectStoreWatch:
        self._record()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._record()


# Roles of the processes a streamed pass keeps busy, by the process title Ray gives them (first match wins)
RAY_ROLES = (
    (
        "Ray Data tasks: read, decode, views",
        ("ray::IDLE", "ray::ReadParquet", "ray::MapBatches", "ray::Read"),
    ),
    ("Ray Data split coordinators (the executors)", ("ray::SplitCoordinator",)),
    ("Ray Data stats and autoscaling actors", ("ray::_StatsActor", "ray::_AutoscalingCoordinatorActor")),
    ("Ray's node processes (raylet, GCS, agents)", ("",)),
)


def _cpu_seconds(proc: Any) -> float:
    times = proc.cpu_times()
    return times.user + times.system


class CpuAccount:
    """CPU seconds spent between :meth:`start` and :meth:`stop`, by this process (the consumer) and by role of
    its descendants: :data:`RAY_ROLES` for a local Ray's processes (sampled at start and stop: a process that ends
    in between is not counted; Ray keeps its workers), ``reaped`` for child processes that ended and were waited
    for in between (a DataLoader's workers, from ``os.times``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @staticmethod
    def _snapshot() -> dict[tuple[int, float], tuple[str, float]]:
        import psutil

        found = {}
        for proc in psutil.Process().children(recursive=True):
            try:
                title = " ".join(proc.cmdline())
                found[(proc.pid, proc.create_time())] = (title, _cpu_seconds(proc))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def start(self) -> None:
        import psutil

        self._me = psutil.Process()
        self._start = (_cpu_seconds(self._me), os.times(), self._snapshot())

    def stop(self) -> None:
        me, times, before = self._start
        after, now = self._snapshot(), os.times()
        seconds = {
            "this process (the consumer)": _cpu_seconds(self._me) - me,
            "reaped": now.children_user + now.children_system - times.children_user - times.children_system,
        }
        for key, (title, cpu) in after.items():
            role = next(name for name, prefixes in RAY_ROLES if any(title.startswith(p) for p in prefixes))
            seconds[role] = seconds.get(role, 0.0) + cpu - before.get(key, (title, 0.0))[1]
        self.seconds = {k: v for k, v in seconds.items() if v > 0.005}


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
    return convert_image_folder(
        root / "src", root / "data", split_by="image", val_fraction=0.1, test_fraction=0.1
    )


@register_benchmark("images", order=12, ray=True)
def images_rate(*, smoke: bool, repeats: int) -> str:
    """Images/s of training views into a worker: Ray Data decoding (streamed) vs a torch DataLoader vs the step."""
    with tempfile.TemporaryDirectory(prefix="raydist-bench-images-") as tmp, ray_instance():
        data = write_images(Path(tmp), smoke)
        crop = SMOKE_CROP if smoke else FULL_CROP
        cfg = load_config(
            "default",
            overrides={
                "data.path": str(data),
                "model.image_encoder": "small-cnn",
                "data.image_size": crop,
                "train.num_workers": 1,
                "train.batch_size": 8 if smoke else 128,
            },
            task_of=dataset_task,
        )
        task = build_task(cfg, DataInfo.from_dataset(data))
        plan = step_plan(cfg, task.info.task)
        rows = plan.rows_per_worker
        views = task.epoch_transform()
        passes = 1 if smoke else WARMUP_EPOCHS + 2 * math.ceil(repeats / 2)  # whole pairs of steady epochs
        datasets, pass_views = train_streams(
            data,
            task.columns,
            task.stream_transform(),
            views,
            epochs=passes,
            num_cpus=1,
            concurrency=PROCESSES,
        )
        stream = StreamedEpochs(
            [ds.streaming_split(1, equal=True)[0] for ds in datasets.values()],
            rows=rows,
            shuffle_buffer=cfg.data.shuffle_buffer,
            seed=0,
            rank=0,
            epochs=passes,
            views=list(pass_views.values()),
        )
        started = time.perf_counter()
        arrays = train_arrays(data, task.columns, task.transform)  # decoded once (the in-memory path's start)
        decode_once = len(arrays["sample_id"]) / (time.perf_counter() - started)
        memory = InMemoryBatches(arrays, rows=rows, rank=0, world=1, seed=0, epoch_transform=views)
        streamed = EpochClock()
        stream_cpu, loader_cpu = CpuAccount(), CpuAccount()
        with ObjectStoreWatch() as store:
            streamed.run(lambda e: (b["image"] for b in stream.epoch(e)), passes, stream_cpu)
        table = read_split(data, "train", verify=False)
        loader = loader_epochs(
            table.column("image").to_pylist(),
            table.column("sample_id").to_numpy(),
            views.images,
            rows,
            passes,
            loader_cpu,
        )
        in_memory = EpochClock()
        in_memory.run(lambda e: (b["image"] for b in memory.epoch(e)), passes)
        batches = list(memory.epoch(0))
        torch.manual_seed(0)
        parts = Trainables.build(cfg, task.build_model(), torch.device("cpu"), steps_per_epoch=len(batches))
        steps = SMOKE_STEPS if smoke else FULL_STEPS
        step_rate = []
        for r in range(passes + 1):
            start = time.perf_counter()
            for s in range(steps):
                train_step(
                    parts,
                    task,
                    batches[s % len(batches)],
                    cfg,
                    plan,
                    StepContext(0, s, 0, 1),
                    torch.device("cpu"),
                    {},
                )
            if r:  # the first pass warms up
                step_rate.append(rows * steps / (time.perf_counter() - start))
    n_images = len(arrays["sample_id"])
    rate = "{:.0f}"
    need = median(step_rate)
    first = "{:.2f} s"

    def path(name: str, clock: EpochClock) -> str:
        return row(
            name,
            rate.format(clock.steady),
            ", ".join(rate.format(r) for r in clock.rates),
            f"{clock.steady / need:.1f}×",
            first.format(clock.first_batch),
        )

    table = [
        row(
            "path",
            f"images/s, steady ({steady_label(passes)})",
            "images/s per epoch",
            "× the step's consumption",
            "first batch",
        ),
        "|---|---:|---:|---:|---:|",
        path(
            f"streamed: Ray Data read, then decode + the epoch's views ({PROCESSES} tasks at once)", streamed
        ),
        path(f"torch DataLoader, {PROCESSES} worker processes: decode + the same views", loader),
        path("in memory: this process makes the epoch's views from its decoded cache", in_memory),
        row("in memory: decoding the split once (before the first epoch)", f"{decode_once:.0f}", "", "", ""),
        row(
            f"one worker's training step, small-cnn, {rows} images per step",
            spread(step_rate, rate),
            "",
            "reference",
            "",
        ),
    ]
    cpu = cpu_table(stream_cpu, streamed, loader_cpu, loader)
    mib = "n/a (this Ray does not report it)"
    store_line = (
        f"Object store while the stream ran: peak {store.peak_mib} MiB, spilled {store.spilled_mib} MiB."
        if store.peak_mib is not None
        else f"Object store: {mib}."
    )
    classes, _, side = SMOKE_DATA if smoke else FULL_DATA
    return (
        f"{n_images} train images ({classes} classes, {side}×{side} PNG), training views {crop}×{crop} (random "
        f"resized crop, flip, normalise); {passes} epoch(s) per path, the streamed one opened as training opens "
        "it (alternate epochs on two splits, each next pass opened ahead); steady = the images of "
        f"{steady_label(passes)} (whole pairs of a slow and a fast epoch) over their time. The step is one process's forward + backward + update of the labels task (default "
        f"preset, small-cnn). Streamed vs DataLoader, steady: {streamed.steady / loader.steady:.2f}× (target "
        "≥ 0.9×). "
        f"{store_line}\n\n" + "\n".join(table) + "\n\n" + cpu
    )


def cpu_table(stream: CpuAccount, streamed: EpochClock, loader: CpuAccount, loaded: EpochClock) -> str:
    """Where each path's CPU went in its steady epochs: seconds per 1,000 images delivered, by role, and in
    cores (CPU seconds over the epochs' wall time)."""
    lines = [
        (
            f"CPU per path, steady epochs ({steady_label(len(streamed.images))}; CPU "
            "seconds per 1,000 images delivered; cores = CPU seconds / wall seconds):"
        ),
        "",
        row("path", "role", "CPU s / 1,000 images", "cores"),
        "|---|---|---:|---:|",
    ]
    for name, account, clock in (("streamed", stream, streamed), ("DataLoader", loader, loaded)):
        images, wall = clock.steady_images_seconds()
        roles = {
            ("worker processes (decode + views)" if k == "reaped" else k): v
            for k, v in account.seconds.items()
        }
        for role, seconds in sorted(roles.items(), key=lambda kv: -kv[1]):
            lines.append(row(name, role, f"{seconds / images * 1e3:.2f}", f"{seconds / wall:.2f}"))
        total = sum(roles.values())
        lines.append(row(name, "**all**", f"{total / images * 1e3:.2f}", f"{total / wall:.2f}"))
    return "\n".join(lines)
