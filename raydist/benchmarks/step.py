"""Benchmark of the training step under Ray Train ("step"): steps/s of a Ray Train run (the real
``build_trainer`` → ``train_loop_per_worker`` → ``run_loop``) with 1 worker against the same model and batches
in a plain single-process loop, and with 2 workers against 2 processes of torch.distributed (gloo, DDP)
without Ray; every process with the torch threads a Ray Train worker gets.

Two modes. Quick (the default, about 2–3 minutes on 2 cores): per worker count one Ray Train run and one
reference run, started side by side, take turns over alternating windows of steps (gated by files, see
:class:`Windows`), so a load change hits both alike and the worker groups start once. Full (``full=True``,
``raydist bench step --full``, over 10 minutes): a fresh Ray fit and fresh reference processes per repeat, plus
the diagnostic rows: ``run_loop`` in one process without Ray (loop, hooks, progress) and a Ray worker without
``train.tune_malloc``."""

from __future__ import annotations

import json
import math
import os
import resource
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from raydist.benchmarks.catalog import register_benchmark
from raydist.benchmarks.harness import held, median, omp_wait_policy, pairs_setup, ray_instance, row, spread
from raydist.config import Config, from_saved
from raydist.data import make_synthetic
from raydist.data.stream import InMemoryBatches, train_arrays
from raydist.distributed.spawn import free_port, spawn
from raydist.malloc import tune_malloc
from raydist.tasks import DataInfo, StepContext, build_task
from raydist.train.hooks import Hook
from raydist.train.loop import Trainables, train_step
from raydist.train.loop import step_rate as progress_step_rate
from raydist.train.plan import RunPlan, step_plan

# (train images, captions per image, feature dim): 5600 × 5 = 28000 rows = 218 steps of the default global
# batch 128 in one epoch (about 9 s of steps: on a shared 2-core box a 2 s window, 54 steps, swung ±10 % from
# run to run); the smoke run: 8 steps of 16 rows
FULL_DATA, SMOKE_DATA = (5600, 5, 128), (26, 5, 16)
FULL_BATCH, SMOKE_BATCH = 128, 16
WARM_STEPS = 3  # steps left out of every rate (thread pools, first TensorBoard write, allocator)
CPUS_PER_WORKER = 1.0  # 2 workers × 1 logical CPU on a 2-core box
TARGET = 0.95
# quick mode: warm-up steps, then `repeats` pairs of windows of QUICK_WINDOW steps (about 2.7 s each at the
# default preset's ~22 steps/s); smoke: 2 warm-up steps and 2 pairs of 3-step windows (its 8 steps)
QUICK_WARM, QUICK_WINDOW = 8, 60
SMOKE_WARM, SMOKE_WINDOW, SMOKE_PAIRS = 2, 3, 2
GATE_TIMEOUT_S = 300.0  # a side waits at most this long for its turn (worker-group start included)
POLL_S = 0.005
SIDES = ("ray", "ref")


class StepClock(Hook):
    """Records ``time.perf_counter()`` and the process's minor page faults so far after every optimizer step
    (appended after the run's other hooks)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.faults: list[int] = []

    def after_step(self, ctx: StepContext, loss: float, stats: dict[str, float]) -> None:
        self.tick()

    def tick(self) -> None:
        self.times.append(time.perf_counter())
        self.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)

    def report(self) -> dict[str, Any]:
        return {"times": self.times, "faults": self.faults}


class Aborted(RuntimeError):
    """A side of the quick mode stopped waiting because another one failed (the ``abort`` file)."""


@dataclass(frozen=True)
class Windows:
    """The quick mode's turns: after ``warm`` steps, ``count`` windows of ``steps`` steps each, which a Ray run
    and its reference take in turns. Each run waits before every window (and after the last one) until the
    driver opens it; the files in ``folder`` (one machine) are the gates: rank 0 of a side creates
    ``at-SIDE-K`` when it reaches window K's start (K = ``count``: its end), the driver ``go-SIDE-K`` to let
    it run, ``abort`` to stop every waiter."""

    folder: str
    warm: int
    steps: int
    count: int

    @property
    def total(self) -> int:
        """Steps a run takes: warm-up and every window."""
        return self.warm + self.steps * self.count

    def span(self, k: int) -> slice:
        """The global steps of window ``k``."""
        start = self.warm + k * self.steps
        return slice(start, start + self.steps)

    def boundary(self, step: int) -> int | None:
        """The window that starts after global step ``step`` (``count``: the end of the last one), else None."""
        k, r = divmod(step + 1 - self.warm, self.steps)
        return k if step + 1 >= self.warm and r == 0 and k <= self.count else None

    def signal(self, name: str) -> None:
        """Create the gate file ``name``."""
        (Path(self.folder) / name).touch()

    def abort(self) -> None:
        """Stop every side and the driver at their next wait."""
        self.signal("abort")

    def wait(self, name: str) -> None:
        """Poll until the gate file ``name`` exists; :class:`Aborted` on ``abort``, TimeoutError after
        :data:`GATE_TIMEOUT_S`."""
        path, abort = Path(self.folder) / name, Path(self.folder) / "abort"
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not path.exists():
            if abort.exists():
                raise Aborted(f"step benchmark aborted while waiting for {name}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"step benchmark: no {name} within {GATE_TIMEOUT_S:.0f} s")
            time.sleep(POLL_S)

    def write_threads(self, report: dict[str, Any]) -> None:
        """Rank 0 of the Ray run: its thread settings, for the reference to copy."""
        tmp = Path(self.folder) / "threads.json.tmp"
        tmp.write_text(json.dumps(report))
        tmp.replace(Path(self.folder) / "threads.json")

    def read_threads(self) -> dict[str, Any]:
        """The Ray worker's thread settings (waits until its first step wrote them)."""
        self.wait("threads.json")
        return json.loads((Path(self.folder) / "threads.json").read_text())


class WindowClock(StepClock):
    """A :class:`StepClock` that holds its run (``side``: "ray" or "ref") at every window boundary of
    ``windows`` until the driver opens the next window; rank 0 of the Ray run writes its thread settings after
    its first step (``report_threads``)."""

    def __init__(self, windows: Windows, side: str, *, report_threads: bool = False) -> None:
        super().__init__()
        self.windows, self.side, self.report_threads = windows, side, report_threads

    def after_step(self, ctx: StepContext, loss: float, stats: dict[str, float]) -> None:
        self.tick()
        self.at_step_end(ctx.global_step, ctx.rank)

    def at_step_end(self, step: int, rank: int) -> None:
        """After global step ``step`` on rank ``rank``: report threads, or wait for the next window's turn."""
        if rank == 0 and step == 0 and self.report_threads:
            self.windows.write_threads(thread_report())
        k = self.windows.boundary(step)
        if k is None:
            return
        if rank == 0:
            self.windows.signal(f"at-{self.side}-{k}")
        self.windows.wait(f"go-{self.side}-{k}")


def take_turns(windows: Windows) -> None:
    """The driver's side of :class:`Windows`: once both runs wait at their first window, open window K for
    one run, wait until it reaches its end, then for the other; the order alternates (Ray first in even
    pairs, the reference first in odd ones), then both are let go."""
    for side in SIDES:
        windows.wait(f"at-{side}-0")
    for k in range(windows.count):
        for side in SIDES if k % 2 == 0 else SIDES[::-1]:
            windows.signal(f"go-{side}-{k}")
            windows.wait(f"at-{side}-{k + 1}")
    for side in SIDES:
        windows.signal(f"go-{side}-{windows.count}")


def window_stats(out: dict[str, Any], windows: Windows) -> tuple[list[float], list[float]]:
    """Steps/s and page faults per step of each window of a run's report (rank 0's times and faults after
    every step; a window's first step, after the wait, is left out as warm-up steps are)."""
    rates = [progress_step_rate(out["times"][windows.span(k)]) for k in range(windows.count)]
    faults = [
        (f[-1] - f[0]) / (len(f) - 1) for f in (out["faults"][windows.span(k)] for k in range(windows.count))
    ]
    return rates, faults


def per_step(totals: list[float]) -> float:
    """Mean increase per step of a running total recorded after each step (a clock, a fault count), over the
    steps after :data:`WARM_STEPS` (from the end of the last warm step to the last step)."""
    totals = totals[WARM_STEPS - 1 :]
    return (totals[-1] - totals[0]) / (len(totals) - 1)


def steps_per_s(times: list[float]) -> float:
    """Steps/s over the steps after :data:`WARM_STEPS`, by the rate of the progress lines
    (:func:`raydist.train.loop.step_rate`); × rows per step it is their samples/s."""
    return progress_step_rate(times[WARM_STEPS - 1 :])


def thread_report() -> dict[str, Any]:
    """What sets the CPU threads of this process."""
    return {
        "torch_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
        "nice": os.nice(0),
    }


def timed_loop_per_worker(loop_config: dict[str, Any]) -> dict[str, Any] | None:
    """Ray Train entry point: :func:`raydist.train.ray_worker.train_loop_per_worker` with a
    :class:`StepClock` after the run's own hooks (a :class:`WindowClock` when ``loop_config`` carries the quick
    mode's ``bench_windows``); rank 0 returns the step times and its thread settings."""
    from raydist.train import ray_worker

    windows = loop_config.pop("bench_windows", None)
    clock = StepClock() if windows is None else WindowClock(windows, "ray", report_threads=True)
    build_hooks = ray_worker.build_hooks
    ray_worker.build_hooks = lambda *args, **kwargs: [*build_hooks(*args, **kwargs), clock]
    try:
        result = ray_worker.train_loop_per_worker(loop_config)
    finally:
        ray_worker.build_hooks = build_hooks
    return None if result is None else {**clock.report(), **thread_report()}


def ray_run(cfg: Config, data_dir: Path, storage: Path, windows: Windows | None = None) -> dict[str, Any]:
    """One Ray Train fit of ``cfg`` (a fresh run name; taking turns over ``windows`` when given): rank 0's step
    times, threads and the fit's wall time."""
    from ray.train.torch import TorchTrainer

    from raydist.train.trainer import build_trainer

    info = DataInfo.from_dataset(data_dir)
    plan = RunPlan(cfg, info, build_task(cfg, info), schedule="as configured")  # the config's own epochs
    base = build_trainer(plan, storage_path=str(storage))
    loop_config = (
        base.train_loop_config if windows is None else {**base.train_loop_config, "bench_windows": windows}
    )
    trainer = TorchTrainer(
        timed_loop_per_worker,
        train_loop_config=loop_config,
        scaling_config=base.scaling_config,
        run_config=base.run_config,
        datasets=base.datasets,
        dataset_config=base.data_config,
    )
    start = time.perf_counter()
    result = trainer.fit()
    return {**result.return_value, "fit_s": time.perf_counter() - start}


def reference_process(
    rank: int,
    world: int,
    cfg_dict: dict[str, Any],
    data_dir: str,
    port: int,
    worker: dict[str, Any] | None,
    out: str,
    loop: bool,
    windows: Windows | None = None,
) -> None:
    """One process of the no-Ray reference: rank ``rank`` of ``world`` (gloo + DDP when world > 1) runs the
    same ``train_step`` on the same in-memory batches as a Ray Train worker; ``loop``: the whole
    ``run_loop`` with a :class:`raydist.train.local.LocalRuntime` instead (world 1). ``windows``: take turns
    with a Ray run (:class:`Windows`, its :data:`Windows.total` steps). Rank 0 writes its step times and page
    faults to ``out``. Torch threads and process priority (nice) are those of the Ray Train ``worker`` (its
    :func:`thread_report`; None: read from ``windows``), malloc thresholds (``train.tune_malloc``) set as in
    a Ray Train worker."""
    if worker is None:
        assert windows is not None, "the worker's threads come from the windows' folder"
        worker = windows.read_threads()
    torch.set_num_threads(worker["torch_threads"])
    os.nice(max(worker["nice"] - os.nice(0), 0))
    cfg, cpu = from_saved(cfg_dict), torch.device("cpu")
    if cfg.train.tune_malloc and not loop:  # run_loop sets them itself
        tune_malloc()
    task = build_task(cfg, DataInfo.from_dataset(data_dir))
    plan = step_plan(cfg, task.info.task, world)
    clock = StepClock() if windows is None else WindowClock(windows, "ref")
    if loop:
        from raydist.train.local import LocalRuntime
        from raydist.train.loop import run_loop
        from raydist.train.wiring import build_hooks

        with tempfile.TemporaryDirectory(prefix="raydist-bench-loop-") as run_dir:
            runtime = LocalRuntime(cfg, task, plan, run_dir)
            run_loop(cfg, task, runtime, plan, hooks=[*build_hooks(cfg, task, runtime, run_dir), clock])
    else:
        if world > 1:
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
            )
        torch.manual_seed(cfg.train.seed)
        model = task.build_model()
        parts = Trainables.build(cfg, model, cpu)
        if world > 1:
            parts.model = torch.nn.parallel.DistributedDataParallel(model)
        arrays = train_arrays(data_dir, task.columns, task.transform)
        batches = InMemoryBatches(
            arrays, rows=plan.rows_per_worker, rank=rank, world=world, seed=cfg.train.seed
        )
        for step, batch in enumerate(batches.epoch(0)):
            train_step(parts, task, batch, cfg, plan, StepContext(0, step, rank, world), cpu, {})
            clock.tick()
            if isinstance(clock, WindowClock):
                clock.at_step_end(step, rank)
                if step + 1 == clock.windows.total:
                    break
        if world > 1:
            dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps({**clock.report(), **thread_report()}))


def reference_run(
    cfg: Config,
    data_dir: Path,
    world: int,
    worker: dict[str, Any] | None,
    *,
    loop: bool = False,
    windows: Windows | None = None,
) -> dict[str, Any]:
    """Run :func:`reference_process` in ``world`` fresh spawned processes with the torch threads and priority
    of the Ray Train ``worker`` (its :func:`thread_report`; None: from ``windows``); rank 0's report."""
    with tempfile.TemporaryDirectory(prefix="raydist-bench-ref-") as tmp:
        out = Path(tmp) / "rank0.json"
        args = (world, cfg.to_dict(), str(data_dir), free_port(), worker, str(out), loop, windows)
        spawn(reference_process, args, nprocs=world)
        return json.loads(out.read_text())


def in_background(
    fn: Callable[[], Any], windows: Windows
) -> tuple[threading.Thread, list[Any], list[BaseException]]:
    """Start ``fn`` in a thread: the thread, a list that gets its return value, and one that gets its error
    (which aborts ``windows``)."""
    results: list[Any] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            results.append(fn())
        except Exception as e:  # noqa: BLE001 -- handed to the driver, which raises it
            errors.append(e)
            windows.abort()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, results, errors


def alternating_run(
    cfg: Config, data_dir: Path, world: int, windows: Windows, storage: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The quick mode at ``world`` workers: a Ray Train fit of ``cfg`` (here) and its reference (spawned, in a
    thread) take turns over ``windows`` (:func:`take_turns`, in a thread); their rank-0 reports. A failure on
    any side aborts the others and is raised here."""
    reference, ref_out, ref_errors = in_background(
        lambda: reference_run(cfg, data_dir, world, None, windows=windows), windows
    )
    turns, _, turn_errors = in_background(lambda: take_turns(windows), windows)
    ray_out, ray_error = None, None
    try:
        ray_out = ray_run(cfg, data_dir, storage, windows)
    except Exception as e:  # noqa: BLE001 -- raised below unless another side failed first
        ray_error = e
        windows.abort()
    reference.join()
    turns.join()
    errors = [*ref_errors, *turn_errors]
    causes = [e for e in errors if not isinstance(e, Aborted)]  # an Aborted one followed another's failure
    if causes:
        raise causes[0]
    if ray_error is not None:
        raise ray_error
    if errors:
        raise errors[0]
    assert ray_out is not None
    return ray_out, ref_out[0]


RateTable = dict[str, list[float]]


def full_mode(
    configs: dict[int, Config], untuned: Config, data_dir: Path, runs: Path, *, smoke: bool, repeats: int
) -> tuple[RateTable, RateTable, dict[str, dict[str, Any]], dict[int, list[float]]]:
    """The full mode: ``repeats`` interleaved rounds of a fresh Ray fit and fresh reference processes per worker
    count (and, except in smoke mode, the diagnostic runs at W=1); steps/s and faults per step of each run by
    key (``ray1``, ``ref1``, …), the reports last seen, and the fits' wall times."""
    rates: RateTable = {}
    faults: RateTable = {}
    seen: dict[str, dict[str, Any]] = {}
    fit_s: dict[int, list[float]] = {w: [] for w in configs}
    for _ in range(repeats):  # interleaved: a load change hits Ray and its reference alike
        for w, cfg in configs.items():
            ray_out = ray_run(cfg, data_dir, runs)
            found = {f"ray{w}": ray_out, f"ref{w}": reference_run(cfg, data_dir, w, ray_out)}
            if w == 1 and not smoke:
                found["loop1"] = reference_run(cfg, data_dir, 1, ray_out, loop=True)
                found["untuned1"] = ray_run(untuned, data_dir, runs)
            for key, out in found.items():
                rates.setdefault(key, []).append(steps_per_s(out["times"]))
                faults.setdefault(key, []).append(per_step(out["faults"]))
                seen[key] = out
            fit_s[w].append(ray_out["fit_s"])
    return rates, faults, seen, fit_s


def quick_mode(
    configs: dict[int, Config], data_dir: Path, tmp: Path, shape: tuple[int, int, int]
) -> tuple[RateTable, RateTable, dict[str, dict[str, Any]], dict[int, list[float]]]:
    """The quick mode: per worker count one Ray fit and one reference run taking turns over :class:`Windows`
    of ``shape`` (warm-up steps, steps per window, windows) in a fresh gate folder under ``tmp``
    (:func:`alternating_run`); per key the rates and faults per step of every window, as :func:`full_mode`."""
    rates: RateTable = {}
    faults: RateTable = {}
    seen: dict[str, dict[str, Any]] = {}
    fit_s: dict[int, list[float]] = {}
    for w, cfg in configs.items():
        gates = tmp / f"gates{w}"
        gates.mkdir()
        windows = Windows(str(gates), *shape)
        ray_out, ref_out = alternating_run(cfg, data_dir, w, windows, tmp / "runs")
        for key, out in {f"ray{w}": ray_out, f"ref{w}": ref_out}.items():
            rates[key], faults[key] = window_stats(out, windows)
            seen[key] = out
        fit_s[w] = [ray_out["fit_s"]]
    return rates, faults, seen, fit_s


@register_benchmark("step", order=4, ray=True, options=("full",))
def step_rate(*, smoke: bool, repeats: int, full: bool = False) -> str:
    """Steps/s of a Ray Train run (1 and 2 workers) vs the same steps without Ray."""
    started = time.perf_counter()
    batch = SMOKE_BATCH if smoke else FULL_BATCH
    shape = (SMOKE_WARM, SMOKE_WINDOW, SMOKE_PAIRS) if smoke else (QUICK_WARM, QUICK_WINDOW, repeats)
    images, captions, dim = SMOKE_DATA if smoke else FULL_DATA
    if not (smoke or full):  # rows for every window: more captions per image (make_synthetic caps the images)
        captions = max(captions, math.ceil((shape[0] + shape[1] * shape[2]) * batch / images))
    worlds = (2,) if smoke else (1, 2)
    with tempfile.TemporaryDirectory(prefix="raydist-bench-step-") as tmp, ray_instance():
        data_dir = make_synthetic(
            Path(tmp) / "data",
            images=images,
            captions_per_image=captions,
            dim=dim,
            seed=0,
            val_images=8,
            test_images=8,
        )
        base = {
            "train.cpus_per_worker": CPUS_PER_WORKER,
            "train.epochs": 1,
            "train.batch_size": batch,
            "train.storage_path": str(Path(tmp) / "runs"),
        }
        if not full:
            base["train.epoch_steps"] = shape[0] + shape[1] * shape[2]
        configs = {w: pairs_setup(data_dir, {**base, "train.num_workers": w})[0] for w in worlds}
        if full:
            untuned = pairs_setup(data_dir, {**base, "train.num_workers": 1, "train.tune_malloc": False})[0]
            measured = full_mode(configs, untuned, data_dir, Path(tmp) / "runs", smoke=smoke, repeats=repeats)
        else:
            measured = quick_mode(configs, data_dir, Path(tmp), shape)
    rates, faults, seen, fit_s = measured
    steps = len(seen[f"ray{worlds[0]}"]["times"])
    cfg = configs[worlds[0]]
    setup = (
        f"Default preset (pairs, GRU, embed {cfg.model.embed_dim}), global batch {cfg.train.batch_size}, synthetic "
        f"data {images}×{captions} rows of {dim}-d in memory, one epoch of {steps} steps (SH); step times rank 0 "
        "records after each optimizer step (Ray: a hook after the run's own hooks; reference: after "
        "`train_step`), and the minor page faults of rank 0's process over the same steps. Ray Train: "
        f"`build_trainer` (workers × {CPUS_PER_WORKER:g} logical CPU, private instance with 4) with "
        "`train_loop_per_worker`; reference: the same `train_step`, model, seed and `InMemoryBatches` in spawned "
        "processes without Ray, torch threads, process priority (nice) and malloc thresholds "
        "(`train.tune_malloc`) set as in the Ray worker. "
    )
    if full:
        how = (
            f"Full mode: rate over steps {WARM_STEPS + 1}…{steps}; a fresh Ray fit and fresh reference processes "
            f"in each of {repeats} interleaved repeats; ratio of the medians, and per repeat. "
        )
    else:
        warm, window, count = shape
        how = (
            f"Quick mode (`--full`: fresh runs per repeat and the diagnostic rows): per W one Ray fit and one "
            f"reference run, started side by side; after {warm} warm-up steps they take turns over {count} pairs "
            f"of {window}-step windows (Ray first in even pairs, the reference first in odd ones; the other side "
            "waits idle, polling a gate file), so a load change hits both alike. A window's rate: its steps 2…"
            f"{window} (the first, after the wait, left out); the rates are per window; the ratio: the median "
            "of the pairs' ratios (Ray window / reference window of the same pair), with their min–max and the "
            "ratio of the median rates. "
        )
    threads = "; ".join(
        f"{k}: torch {v['torch_threads']} (interop {v['interop_threads']}), OMP_NUM_THREADS="
        f"{v['OMP_NUM_THREADS']}, nice {v['nice']}"
        for k, v in seen.items()
    )
    fits = ", ".join(f"W={w}: {spread(fit_s[w])} s" for w in worlds)
    return (
        setup
        + how
        + f"Threads seen: {threads}; OMP_WAIT_POLICY={omp_wait_policy()} in the driver. Wall time of a whole Ray "
        f"fit (worker start, data read, steps, validation, checkpoint): {fits}; of this benchmark (Ray start, "
        f"data, every run): {time.perf_counter() - started:.0f} s.\n\n"
        + "\n".join(step_table(rates, faults, worlds, "per repeat" if full else "per pair"))
    )


def step_table(rates: RateTable, faults: RateTable, worlds: tuple[int, ...], paired: str) -> list[str]:
    """The markdown rows of the step benchmark: per W the reference, Ray Train with its ratio and the diagnostic
    rows that were measured. ``paired`` "per repeat" (full mode): the ratio of the median rates, and the
    repeats' ratios as median (min–max); "per pair" (quick mode): the median of the window pairs' ratios (the
    target is judged on it), their min–max, and the ratio of the medians."""

    def run_row(label: str, key: str, ratio: str = "", target: str = "", ok: str = "") -> str:
        return row(label, spread(rates[key], "{:.2f}"), spread(faults[key], "{:.0f}"), ratio, target, ok)

    def ratio_to(key: str, ref: str) -> tuple[float, str]:
        of_medians = median(rates[key]) / median(rates[ref])
        ratios = [a / b for a, b in zip(rates[key], rates[ref], strict=True)]
        if paired == "per repeat":
            return of_medians, f"{of_medians:.3f}× (per repeat {spread(ratios, '{:.2f}')})"
        ratio = median(ratios)  # adjacent windows: what a load change between windows leaves out
        return (
            ratio,
            f"{ratio:.3f}× (pairs {min(ratios):.2f}–{max(ratios):.2f}; of the medians {of_medians:.3f}×)",
        )

    rows = [
        row(
            "run",
            "steps/s, median (min–max)",
            "page faults / step (rank 0)",
            "ratio to reference",
            "target",
            "held",
        ),
        "|---|---:|---:|---:|---:|---|",
    ]
    for w in worlds:
        reference = "plain single-process loop" if w == 1 else "2 processes, torch.distributed gloo + DDP"
        rows.append(run_row(f"{reference} (reference, W={w})", f"ref{w}"))
        ratio, text = ratio_to(f"ray{w}", f"ref{w}")
        label = f"Ray Train, {w} worker{'s' if w > 1 else ''} × {CPUS_PER_WORKER:g} CPU"
        rows.append(run_row(label, f"ray{w}", text, f"≥ {TARGET}×", held(ratio >= TARGET)))
        if w == 1 and "loop1" in rates:
            rows.append(
                run_row(
                    "`run_loop` + hooks, 1 process, no Ray (diagnostic)",
                    "loop1",
                    ratio_to("loop1", "ref1")[1],
                )
            )
            label = "Ray Train, 1 worker, `train.tune_malloc=false` (diagnostic)"
            rows.append(run_row(label, "untuned1", ratio_to("untuned1", "ref1")[1]))
    return rows
