"""Benchmark of the streamed data path ("data"): rows/s that the workers' Ray Data stream
(raydist.data.stream: ``read_parquet`` → columns → the task's transform → ``streaming_split`` →
``StreamedEpochs`` → tensors) delivers into one worker, against pyarrow reading the same shards into numpy and
against the rows/s one worker's training step consumes; time to the first batch and per-epoch restart cost."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

from raydist.benchmarks.catalog import register_benchmark
from raydist.benchmarks.harness import (
    held,
    median,
    omp_wait_policy,
    pairs_setup,
    ray_instance,
    row,
    seconds,
    spread,
)
from raydist.config import Config, from_saved
from raydist.data import make_synthetic
from raydist.data.schema import IMAGE
from raydist.data.shards import feature_matrix, split_files
from raydist.data.stream import (
    InMemoryBatches,
    StreamedEpochs,
    train_arrays,
    train_dataset,
    train_splits,
    train_transform,
)
from raydist.distributed import StepPlan
from raydist.malloc import tune_malloc, worker_env
from raydist.tasks import DataInfo, StepContext, Task, build_task, to_tensors
from raydist.train.loop import Trainables, train_step
from raydist.train.plan import step_plan

# (images, captions per image, feature dim, rows per shard): 100,000 train rows of 256-d features + captions
FULL_DATA, SMOKE_DATA = (5000, 20, 256, 4100), (40, 5, 16, 200)
FULL_STEPS, SMOKE_STEPS = 20, 2  # training steps timed per repeat for the consumption rate
TARGET_PYARROW, TARGET_CONSUMPTION, TARGET_FIRST_BATCH_S = 0.5, 5.0, 10.0
FULL_BACK_TO_BACK, SMOKE_BACK_TO_BACK = 3, 1  # epochs timed back to back (after one untimed epoch)


def write_shards(out: Path, smoke: bool) -> Path:
    """The synthetic dataset of the benchmark (val/test: a few images, unused)."""
    images, captions, dim, per_shard = SMOKE_DATA if smoke else FULL_DATA
    return make_synthetic(
        out,
        images=images,
        captions_per_image=captions,
        dim=dim,
        seed=0,
        val_images=4,
        test_images=4,
        rows_per_shard=per_shard,
    )


def pyarrow_read(files: list[str], columns: tuple[str, ...]) -> int:
    """The shards into numpy with pyarrow alone (features as float32 [N, D], other columns to numpy); rows."""
    table = pq.read_table(files, columns=list(columns))
    arrays = {
        c: feature_matrix(table.column(c)) if c == IMAGE else table.column(c).to_numpy(zero_copy_only=False)
        for c in columns
    }
    return len(arrays[IMAGE])


class WorkerProbe:
    """Stands where a Ray Train worker stands (a Ray actor with 1 logical CPU, so Ray's thread count and
    process priority, and the worker's malloc settings): it holds its ``streaming_split`` iterators of the
    train stream and times, in turn, pyarrow reading the shards, one streamed epoch into tensors, and the
    training steps it would run."""

    def __init__(
        self, cfg_dict: dict[str, Any], data_dir: str, shards: list[Any], steps: int, epochs: int
    ) -> None:
        self.cfg = from_saved(cfg_dict)
        if self.cfg.train.tune_malloc:  # as run_loop does
            tune_malloc()
        self.data_dir = Path(data_dir)
        self.task = build_task(self.cfg, DataInfo.from_dataset(self.data_dir))
        self.rows = step_plan(self.cfg, self.task.info.task).rows_per_worker
        self.stream = StreamedEpochs(
            shards,
            rows=self.rows,
            shuffle_buffer=self.cfg.data.shuffle_buffer,
            seed=self.cfg.train.seed,
            rank=0,
            epochs=epochs,
        )
        self.files = split_files(self.data_dir, "train")
        self._steps = consumption_steps(self.cfg, self.task, self.data_dir, steps)

    def settings(self) -> dict[str, Any]:
        """Threads and priority of this process."""
        return {
            "torch_threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "nice": os.nice(0),
        }

    def pyarrow(self) -> float:
        """Seconds of :func:`pyarrow_read` of all train shards."""
        return seconds(lambda: pyarrow_read(self.files, self.task.columns))

    def steps(self) -> float:
        """Seconds of the training steps (:func:`consumption_steps`)."""
        return self._steps()

    def back_to_back(self, first_epoch: int, count: int) -> tuple[int, float]:
        """Epochs ``first_epoch … + count`` with nothing in between, the first untimed (it was opened during
        the previous pass's gap): (rows, seconds) of the other ``count``, each opened as in training (when the
        one before started: the sustained rate, with every pass's start in it)."""
        rows, start = 0, 0.0
        for epoch in range(first_epoch, first_epoch + count + 1):
            if epoch == first_epoch + 1:
                rows, start = 0, time.perf_counter()
            for batch in self.stream.epoch(epoch):
                rows += len(to_tensors(batch, "cpu")["image"])
        return rows, time.perf_counter() - start

    def epoch(self, epoch: int) -> tuple[int, float, float]:
        """Iterate one streamed epoch into torch tensors, as the loop does: (rows, seconds to the first
        batch, seconds in all)."""
        start, first, rows = time.perf_counter(), 0.0, 0
        for batch in self.stream.epoch(epoch):
            rows += len(to_tensors(batch, "cpu")["image"])
            if not first:
                first = time.perf_counter() - start
        return rows, first, time.perf_counter() - start


def consumption_steps(cfg: Config, task: Task, data_dir: Path, steps: int) -> Callable[[], float]:
    """A function that runs ``steps`` training steps of one worker (the default preset's rows per worker,
    MH, this process's torch threads) and returns their seconds."""
    plan = step_plan(cfg, task.info.task)
    plan = StepPlan(plan.rows_per_worker, plan.negative_set_size, 1)
    arrays = train_arrays(data_dir, task.columns, task.transform)
    batches = InMemoryBatches(arrays, rows=plan.rows_per_worker, rank=0, world=1, seed=cfg.train.seed)
    torch.manual_seed(cfg.train.seed)
    parts = Trainables.build(cfg, task.build_model(), torch.device("cpu"))
    epoch = cfg.loss.warmup_sh_epochs  # the first MH epoch
    source: Iterator[dict[str, Any]] = iter(())

    def run() -> float:
        nonlocal source
        start = time.perf_counter()
        for step in range(steps):
            batch = next(source, None)
            if batch is None:
                source = batches.epoch(step)
                batch = next(source)
            train_step(parts, task, batch, cfg, plan, StepContext(epoch, step, 0, 1), torch.device("cpu"), {})
        return time.perf_counter() - start

    run()  # warm-up: thread pool, allocator, first MH step
    return run


@register_benchmark("data", order=3, ray=True)
def data_rate(*, smoke: bool, repeats: int) -> str:
    """Rows/s the streamed train split delivers as torch batches into one worker vs pyarrow and the step."""
    import ray

    with tempfile.TemporaryDirectory(prefix="raydist-bench-data-") as tmp, ray_instance():
        started = time.perf_counter()
        data_dir = write_shards(Path(tmp) / "shards", smoke)
        write_s = time.perf_counter() - started
        cfg, task, plan = pairs_setup(data_dir)
        files = split_files(data_dir, "train")
        total_rows = sum(pq.read_metadata(f).num_rows for f in files)
        mib = sum(Path(f).stat().st_size for f in files) / 2**20
        steps = SMOKE_STEPS if smoke else FULL_STEPS

        created = time.perf_counter()
        transform = train_transform(task.stream_transform(), cfg.data.train_fraction, cfg.train.seed)
        back = SMOKE_BACK_TO_BACK if smoke else FULL_BACK_TO_BACK
        epochs = repeats + 2 + back
        shards = [
            train_dataset(data_dir, task.columns, transform).streaming_split(1, equal=True)[0]
            for _ in train_splits(epochs)
        ]
        create_s = time.perf_counter() - created
        env = {"env_vars": worker_env(cfg.train.tune_malloc)}  # as build_trainer gives its workers
        probe = (
            ray.remote(num_cpus=1)(WorkerProbe)
            .options(runtime_env=env)
            .remote(cfg.to_dict(), str(data_dir), shards, steps, epochs)
        )
        settings = ray.get(probe.settings.remote())
        ray_cpus = ray.cluster_resources().get("CPU", 0.0)
        pa_rate, stream_rate, step_rate, restart = [], [], [], []
        for i in range(repeats + 1):  # pass 0 is the first epoch / first read, the others are warm
            pa_s = ray.get(probe.pyarrow.remote())
            rows, first_s, epoch_s = ray.get(probe.epoch.remote(i))
            if i == 0:  # the dataset's creation included
                first_batch, stream_first = create_s + first_s, rows / (create_s + epoch_s)
                pa_first = total_rows / pa_s
            else:
                pa_rate.append(total_rows / pa_s)
                stream_rate.append(rows / epoch_s)
                restart.append(first_s)
            step_rate.append(plan.rows_per_worker * steps / ray.get(probe.steps.remote()))
        streamed_rows = rows
        back_rows, back_s = ray.get(probe.back_to_back.remote(repeats + 1, back))
        ray.kill(probe)

    sustained = back_rows / back_s
    warm_ratio = sustained / median(pa_rate)
    consume_ratio = sustained / median(step_rate)
    ms = "{:.0f}"
    table = [
        row("measurement", "rows/s, median (min–max)", "ratio", "target", "held"),
        "|---|---:|---:|---:|---|",
        row("pyarrow → numpy, warm", spread(pa_rate, ms), "reference", "", ""),
        row("pyarrow → numpy, first read", f"{pa_first:.0f}", "", "", ""),
        row(
            f"stream → torch, {back} warm epochs back to back (sustained; each pass's start paid)",
            f"{sustained:.0f}",
            f"{warm_ratio:.2f}× pyarrow warm",
            f"≥ {TARGET_PYARROW}×",
            held(warm_ratio >= TARGET_PYARROW),
        ),
        row(
            "stream → torch, warm epoch after a gap (pyarrow + steps ran while the pass was opened ahead)",
            spread(stream_rate, ms),
            f"{median(stream_rate) / median(pa_rate):.2f}× pyarrow warm",
            "",
            "",
        ),
        row(
            "stream → torch, first epoch (dataset creation included)",
            f"{stream_first:.0f}",
            f"{stream_first / pa_first:.2f}× pyarrow first",
            "",
            "",
        ),
        row(
            f"training step consumes (1 worker, {plan.rows_per_worker} rows/step)",
            spread(step_rate, ms),
            f"stream sustained = {consume_ratio:.1f}× this",
            f"≥ {TARGET_CONSUMPTION:g}×",
            held(consume_ratio >= TARGET_CONSUMPTION),
        ),
        row(
            "time to first batch, from creating the dataset (s)",
            f"{first_batch:.2f}",
            "",
            f"≤ {TARGET_FIRST_BATCH_S:g} s",
            held(first_batch <= TARGET_FIRST_BATCH_S),
        ),
        row(
            "per-epoch restart: epoch start → first batch (s; the pass was opened ahead)",
            spread(restart, "{:.2f}"),
            f"≈ {median(restart) * median(stream_rate):.0f} rows of warm streaming",
            "",
            "",
        ),
    ]
    return (
        f"{total_rows} train rows of {task.info.feature_dim}-d float32 features + captions in {len(files)} Parquet "
        f"shards ({mib:.1f} MiB; written in {write_s:.1f} s by `make_synthetic`, so the OS page cache is warm "
        "for every read). Everything is measured inside one Ray actor with 1 logical CPU standing where a Ray "
        "Train worker stands (same thread count and process priority as a worker: "
        f"torch threads {settings['torch_threads']}, OMP_NUM_THREADS={settings['OMP_NUM_THREADS']}, nice "
        f"{settings['nice']}; OMP_WAIT_POLICY={omp_wait_policy()}), in a Ray instance with "
        f"{ray_cpus:g} logical CPUs. Stream = the workers' code path: `raydist.data.stream.train_dataset` (read_parquet "
        "→ columns → the pairs task's tokenising transform) → `streaming_split(1, equal=True)` handed to the actor "
        "→ `StreamedEpochs` (two splits of the stream for alternate epochs, each pass opened in the background when "
        f"the one before starts, as in training; {plan.rows_per_worker} rows per batch = the default preset's rows per worker, "
        f"`data.shuffle_buffer`={cfg.data.shuffle_buffer}) → `to_tensors`; {streamed_rows} rows per epoch "
        "(`drop_last`). pyarrow = `pq.read_table` of the same shards → numpy (no tokenising). Step = the default "
        f"preset's `train_step` (MH) at one worker's rows, {steps} steps per pass after a warm-up. Pass 0 is the "
        f"first epoch / first read; then {repeats} warm passes, each pyarrow → stream epoch → steps; then "
        f"{back} epochs back to back after an untimed one.\n\n" + "\n".join(table)
    )
