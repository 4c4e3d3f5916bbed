"""Benchmark of the training step under Ray Train ("step"): steps/s of a Ray Train run (the real
``build_trainer`` → ``train_loop_per_worker`` → ``run_loop``) with 1 worker against the same model and batches
in a plain single-process loop, and with 2 workers against 2 processes of torch.distributed (gloo, DDP)
without Ray; every process with the torch threads a Ray Train worker gets. Diagnostic rows: ``run_loop`` in
one process without Ray (loop, hooks, progress) and the thread settings seen inside the workers."""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time
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
    :class:`StepClock` after the run's own hooks; rank 0 returns the step times and its thread settings."""
    from raydist.train import ray_worker

    clock, build_hooks = StepClock(), ray_worker.build_hooks
    ray_worker.build_hooks = lambda *args, **kwargs: [*build_hooks(*args, **kwargs), clock]
    try:
        result = ray_worker.train_loop_per_worker(loop_config)
    finally:
        ray_worker.build_hooks = build_hooks
    return None if result is None else {**clock.report(), **thread_report()}


def ray_run(cfg: Config, data_dir: Path, storage: Path) -> dict[str, Any]:
    """One Ray Train fit of ``cfg`` (a fresh run name): rank 0's step times, threads and the fit's wall time."""
    from ray.train.torch import TorchTrainer

    from raydist.train.trainer import build_trainer

    info = DataInfo.from_dataset(data_dir)
    plan = RunPlan(cfg, info, build_task(cfg, info), schedule="as configured")  # the config's own epochs
    base = build_trainer(plan, storage_path=str(storage))
    trainer = TorchTrainer(
        timed_loop_per_worker,
        train_loop_config=base.train_loop_config,
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
    threads: int,
    nice: int,
    out: str,
    loop: bool,
) -> None:
    """One process of the no-Ray reference: rank ``rank`` of ``world`` (gloo + DDP when world > 1) runs the
    same ``train_step`` on the same in-memory batches as a Ray Train worker; ``loop``: the whole
    ``run_loop`` with a :class:`raydist.train.local.LocalRuntime` instead (world 1). Rank 0 writes its step
    times and page faults to ``out``. Torch threads, process priority (``nice``) and malloc thresholds
    (``train.tune_malloc``) are set as in a Ray Train worker."""
    torch.set_num_threads(threads)
    os.nice(max(nice - os.nice(0), 0))
    cfg, cpu = from_saved(cfg_dict), torch.device("cpu")
    if cfg.train.tune_malloc and not loop:  # run_loop sets them itself
        tune_malloc()
    task = build_task(cfg, DataInfo.from_dataset(data_dir))
    plan = step_plan(cfg, task.info.task, world)
    clock = StepClock()
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
        if world > 1:
            dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps({**clock.report(), **thread_report()}))


def reference_run(
    cfg: Config, data_dir: Path, world: int, worker: dict[str, Any], *, loop: bool = False
) -> dict[str, Any]:
    """Run :func:`reference_process` in ``world`` fresh spawned processes with the torch threads and priority
    of the Ray Train ``worker`` (its :func:`thread_report`); rank 0's report."""
    with tempfile.TemporaryDirectory(prefix="raydist-bench-ref-") as tmp:
        port = free_port()
        out = Path(tmp) / "rank0.json"
        args = (
            world,
            cfg.to_dict(),
            str(data_dir),
            port,
            worker["torch_threads"],
            worker["nice"],
            str(out),
            loop,
        )
        spawn(reference_process, args, nprocs=world)
        return json.loads(out.read_text())


@register_benchmark("step", order=4, ray=True)
def step_rate(*, smoke: bool, repeats: int) -> str:
    """Steps/s of a Ray Train run (1 and 2 workers) vs the same steps without Ray."""
    images, captions, dim = SMOKE_DATA if smoke else FULL_DATA
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
            "train.batch_size": SMOKE_BATCH if smoke else FULL_BATCH,
            "train.storage_path": str(Path(tmp) / "runs"),
        }
        configs = {w: pairs_setup(data_dir, {**base, "train.num_workers": w})[0] for w in worlds}
        untuned = pairs_setup(data_dir, {**base, "train.num_workers": 1, "train.tune_malloc": False})[0]
        rates: dict[str, list[float]] = {}
        faults: dict[str, list[float]] = {}
        seen: dict[str, dict[str, Any]] = {}
        fit_s: dict[int, list[float]] = {w: [] for w in worlds}
        for _ in range(repeats):  # interleaved: a load change hits Ray and its reference alike
            for w in worlds:
                ray_out = ray_run(configs[w], data_dir, Path(tmp) / "runs")
                ref_out = reference_run(configs[w], data_dir, w, ray_out)
                runs = {f"ray{w}": ray_out, f"ref{w}": ref_out}
                if w == 1 and not smoke:
                    runs["loop1"] = reference_run(configs[w], data_dir, 1, ray_out, loop=True)
                    runs["untuned1"] = ray_run(untuned, data_dir, Path(tmp) / "runs")
                for key, out in runs.items():
                    rates.setdefault(key, []).append(steps_per_s(out["times"]))
                    faults.setdefault(key, []).append(per_step(out["faults"]))
                    seen[key] = out
                fit_s[w].append(ray_out["fit_s"])
        steps = len(seen[f"ray{worlds[0]}"]["times"])

    def run_row(label: str, key: str, ratio: str = "", target: str = "", ok: str = "") -> str:
        return row(label, spread(rates[key], "{:.2f}"), spread(faults[key], "{:.0f}"), ratio, target, ok)

    def ratio_to(key: str, ref: str) -> tuple[float, str]:
        ratio = median(rates[key]) / median(rates[ref])
        paired = [a / b for a, b in zip(rates[key], rates[ref], strict=True)]
        return ratio, f"{ratio:.3f}× (per repeat {spread(paired, '{:.2f}')})"

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
            rows.append(
                run_row(
                    "Ray Train, 1 worker, `train.tune_malloc=false` (diagnostic)",
                    "untuned1",
                    ratio_to("untuned1", "ref1")[1],
                )
            )
    threads = "; ".join(
        f"{k}: torch {v['torch_threads']} (interop {v['interop_threads']}), OMP_NUM_THREADS="
        f"{v['OMP_NUM_THREADS']}, nice {v['nice']}"
        for k, v in seen.items()
    )
    fits = ", ".join(f"W={w}: {spread(fit_s[w])} s" for w in worlds)
    return (
        f"Default preset (pairs, GRU, embed {configs[worlds[0]].model.embed_dim}), global batch "
        f"{configs[worlds[0]].train.batch_size}, synthetic data {images}×{captions} rows of {dim}-d in memory, one "
        f"epoch of {steps} steps (SH); rate over steps {WARM_STEPS + 1}…{steps} from the step times rank 0 "
        "records after each optimizer step (Ray: a hook after the run's own hooks; reference: after "
        "`train_step`), and the minor page faults of rank 0's process over the same steps. Ray Train: "
        f"`build_trainer` (workers × {CPUS_PER_WORKER:g} logical CPU, private instance with 4) with "
        "`train_loop_per_worker`, fresh run each repeat; reference: the same `train_step`, model, seed and "
        "`InMemoryBatches` in fresh spawned processes without Ray, torch threads, process priority (nice) and "
        "malloc thresholds (`train.tune_malloc`) set as in the Ray worker. "
        f"{repeats} interleaved repeats. Threads seen: {threads}; OMP_WAIT_POLICY={omp_wait_policy()} in the "
        f"driver. Wall time of a whole Ray fit (worker start, data read, validation, checkpoint): {fits}.\n\n"
        + "\n".join(rows)
    )
