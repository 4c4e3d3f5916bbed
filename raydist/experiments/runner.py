"""Run a registered experiment end to end: dataset, its Tune sweeps (``raydist.tune.sweep.run_sweep``), the
trials' histories and test metrics, then the experiment's summary (markdown table, PNGs, verdict)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from raydist.config import Config, ConfigError, from_saved, load_config
from raydist.console import route_ray_output
from raydist.data import dataset_task, load_manifest
from raydist.experiments.catalog import get_experiment
from raydist.experiments.datasets import experiment_dataset
from raydist.experiments.records import (
    TRIALS_FILE,
    TrialRecord,
    best_epoch,
    load_records,
    local_checkpoint,
    read_history,
    save_records,
)
from raydist.experiments.spec import Experiment, Setup, Summary, Sweep
from raydist.runfiles import LOG_FILE
from raydist.tune.space import (
    SweepSpace,
    load_space,
    parse_space,
    resolve_base_config,
    shipped_space_file,
    trial_config,
)

SETUP_FILE = "setup.json"
SUMMARY_FILE = "summary.md"
ROWS_FILE = "rows.json"


def sweep_space(experiment: Experiment, sweep: Sweep, seeds: tuple[int, ...]) -> SweepSpace:
    """The sweep's space: its file with the ``grid`` entries replaced and ``train.seed`` set to ``seeds``;
    named ``<file>-<label>``, so each sweep gets its own experiment folder."""
    name = sweep.space or experiment.space
    data = yaml.safe_load(shipped_space_file(name).read_text())
    space = dict(data.get("space") or {})
    for key, values in {**sweep.grid, "train.seed": list(seeds)}.items():
        if key not in space:
            raise ConfigError(
                f"space {name!r} does not sweep {key}; experiment {experiment.name!r} replaces it"
            )
        space[key] = {"grid": list(values)}
    return parse_space({**data, "space": space}, name=f"{name}-{sweep.label}" if sweep.label else name)


def run_experiment(
    name: str,
    *,
    quick: bool = False,
    seeds: list[int] | None = None,
    data: str | None = None,
    out_dir: str | Path | None = None,
    preset: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    storage: str | None = None,
    address: str | None = None,
) -> dict[str, Any]:
    """Run experiment ``name`` and summarise it into ``out_dir`` (default ``./runs/experiments/<name>-<time>``).

    ``quick``: the tiny preset, one seed, 1–2 epochs, a tiny dataset generated into ``out_dir`` (a smoke
    test). ``seeds`` replaces the experiment's seeds; ``data`` a dataset folder or a named dataset of
    the experiment's task (:data:`raydist.experiments.datasets.DATA_SOURCES`); ``preset`` the base preset; ``overrides`` dotted config keys
    for every trial (e.g. ``train.use_gpu=true``); ``storage`` where the Tune experiment folders go
    (default ``<out_dir>/runs``; ``s3://`` … on clusters); ``address`` a Ray cluster to join. Every sweep is
    checked before the first trial starts. Returns the paths and rows (see :func:`write_summary`)."""
    from raydist.runtime import init_ray
    from raydist.tune.sweep import run_sweep, sweep_cpus

    started = time.perf_counter()
    experiment = get_experiment(name)
    out = Path(out_dir or f"runs/experiments/{name}-{time.strftime('%Y%m%d-%H%M%S')}").expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    data_dir = experiment_dataset(experiment.task, data or experiment.data, out / "data", quick=quick)
    chosen = tuple(seeds) if seeds else experiment.seeds
    base_overrides = {**(experiment.quick if quick else {}), **(overrides or {}), "data.path": str(data_dir)}
    file_base = load_space(
        shipped_space_file(experiment.space)
    ).base  # swept values are checked per sweep below
    base = load_config(
        preset=preset or experiment.preset, overrides={**file_base, **base_overrides}, task_of=dataset_task
    )
    manifest = load_manifest(data_dir)
    setup = Setup(
        quick=quick,
        seeds=chosen[:1] if quick else chosen,
        data_dir=data_dir,
        train_rows=manifest.splits["train"].rows,
        num_classes=manifest.num_classes,
        base=base,
    )
    planned = []
    for sweep in experiment.sweeps(setup):  # every sweep is checked before any trial runs
        space = sweep_space(experiment, sweep, setup.seeds)
        cfg = resolve_base_config(
            space, preset=preset or experiment.preset, overrides={**base_overrides, **sweep.overrides}
        )
        planned.append((sweep, space, cfg))
    plugins = list(dict.fromkeys(p for _, _, cfg in planned for p in cfg.plugins))
    init_ray(max(sweep_cpus(space, cfg) for _, space, cfg in planned), address, plugins=plugins)
    route_ray_output(out / LOG_FILE)  # until each sweep sends Ray's output to its own folder's log
    storage = storage or (None if base.train.storage_path else str(out / "runs"))
    records: list[TrialRecord] = []
    folders = []
    for sweep, space, cfg in planned:
        outcome = run_sweep(space, cfg, storage_path=storage, address=address)
        folders.append(outcome.experiment_path)
        records += trial_records(outcome, space, cfg, sweep.label, data_dir, out / "checkpoints")
    save_records(records, out / TRIALS_FILE)
    saved = {
        "name": name,
        "quick": quick,
        "seeds": list(setup.seeds),
        "data_dir": str(data_dir),
        "train_rows": setup.train_rows,
        "num_classes": setup.num_classes,
        "base": base.to_dict(),
        "sweeps": folders,
    }
    (out / SETUP_FILE).write_text(json.dumps(saved, indent=1))
    result = write_summary(experiment, records, out, setup)
    return {**result, "sweeps": folders, "seconds": time.perf_counter() - started}


def trial_records(
    outcome: Any, space: SweepSpace, base: Config, label: str, data_dir: Path, cache: Path
) -> list[TrialRecord]:
    """A record per trial of a finished sweep: history from its ``result.json``, best epoch by the sweep's
    metric, and the test metrics of that epoch's checkpoint (copied under ``cache`` when remote)."""
    from raydist.retrieval.trained import evaluate_checkpoint

    records = []
    for row in outcome.rows:
        history = read_history(f"{outcome.experiment_path}/{row.trial}")
        epoch = best_epoch(history, space.metric, space.mode)
        report = next((r for r in history if r["epoch"] == epoch), {})
        checkpoint = report.get("checkpoint_path")
        test = {}
        if checkpoint:
            checkpoint = str(local_checkpoint(checkpoint, cache))
            test = evaluate_checkpoint(checkpoint, data_dir, "test")
        records.append(
            TrialRecord(
                sweep=label,
                trial=row.trial,
                status=row.status,
                config=trial_config(base, row.values).flat(),
                history=history,
                metric=space.metric,
                best_epoch=epoch,
                checkpoint=checkpoint,
                test=test,
                error=row.error,
            )
        )
    return records


QUICK_NOTE = "Quick mode (one seed, tiny data, few epochs): a smoke test, not evidence."


def write_summary(
    experiment: Experiment, records: list[TrialRecord], out: Path, setup: Setup
) -> dict[str, Any]:
    """Run the experiment's summary and write ``summary.md`` (claim, data, table, verdict, figures) and
    ``rows.json`` into ``out``. Returns ``name``, ``claim``, ``out_dir``, ``data_dir``, ``table``,
    ``verdict``, ``rows``, ``figures`` (name → path) and ``files`` (summary, rows, trials)."""
    summary: Summary = experiment.summarise(records, out, setup)
    verdict = [*summary.verdict, *([QUICK_NOTE] if setup.quick else [])]
    failed = [r for r in records if r.status == "ERROR"]
    lines = [
        f"# {experiment.name}: {experiment.claim}",
        "",
        f"Reference: {experiment.reference}.",
        f"Data: `{setup.data_dir}` ({setup.train_rows} train rows); seeds {list(setup.seeds)}; "
        f"{'quick' if setup.quick else 'normal'} mode; {len(records)} trials"
        + (f", {len(failed)} failed: " + "; ".join(f"{r.trial}: {r.error}" for r in failed) if failed else "")
        + ".",
        "",
        summary.table,
        "",
        *(f"- {line}" for line in verdict),
        "",
        *(f"![{key}]({path.name})" for key, path in summary.figures.items()),
    ]
    (out / SUMMARY_FILE).write_text("\n".join(lines) + "\n")
    (out / ROWS_FILE).write_text(json.dumps(summary.rows, indent=1, default=str))
    return {
        "name": experiment.name,
        "claim": experiment.claim,
        "out_dir": str(out),
        "data_dir": str(setup.data_dir),
        "table": summary.table,
        "verdict": verdict,
        "rows": summary.rows,
        "figures": {key: str(path) for key, path in summary.figures.items()},
        "files": {
            "summary": str(out / SUMMARY_FILE),
            "rows": str(out / ROWS_FILE),
            "trials": str(out / TRIALS_FILE),
        },
    }


def summarise_saved(out_dir: str | Path) -> dict[str, Any]:
    """Re-run the summary of a finished experiment from its folder (``trials.json``, ``setup.json``), e.g.
    after changing a figure; no Ray, no training."""
    out = Path(out_dir).expanduser().resolve()
    try:
        saved = json.loads((out / SETUP_FILE).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"{out_dir} is not a finished experiment folder (cannot read {SETUP_FILE}: {e})"
        ) from e
    setup = Setup(
        quick=saved["quick"],
        seeds=tuple(saved["seeds"]),
        data_dir=Path(saved["data_dir"]),
        train_rows=saved["train_rows"],
        num_classes=saved["num_classes"],
        base=from_saved(saved["base"]),
    )
    experiment = get_experiment(saved["name"])
    return {
        **write_summary(experiment, load_records(out / TRIALS_FILE), out, setup),
        "sweeps": saved["sweeps"],
    }
