"""PNG plots of a run folder (history.json, steps.jsonl) and of a Tune sweep folder (each trial's best
metric against its searched values). matplotlib is imported only when plotting and renders with Agg,
without pyplot, so no global backend is touched."""

from __future__ import annotations

import csv
import itertools
import json
import re
from pathlib import Path
from typing import Any

from raydist.config import is_finite_number
from raydist.runfiles import HISTORY_FILE, PLOTS_DIR, STEPS_FILE, SWEEP_FILE
from raydist.tune.space import SweepSpace, parse_space

NEGATIVE_STATS = ("neg/hardest_sim", "neg/remote_hardest_frac")
NEGATIVE_STAT_UNITS = {
    "neg/hardest_sim": "mean score of the hardest negatives",
    "neg/remote_hardest_frac": "fraction of hardest negatives on another rank",
}
SWITCH_LABEL = "SH → MH"
Series = tuple[list[float], list[float]]


def load_run(run_dir: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The per-epoch history and the logged steps of a run folder (either may be missing, not both)."""
    run_dir = Path(run_dir)
    history_path, steps_path = run_dir / HISTORY_FILE, run_dir / STEPS_FILE
    if not history_path.is_file() and not steps_path.is_file():
        raise FileNotFoundError(f"{run_dir}: neither {HISTORY_FILE} nor {STEPS_FILE} to plot")
    history = json.loads(history_path.read_text()) if history_path.is_file() else []
    lines = steps_path.read_text().splitlines() if steps_path.is_file() else []
    return history, [json.loads(line) for line in lines if line.strip()]


def phase_switch_step(history: list[dict[str, Any]]) -> int | None:
    """Global step (counted from 1) that starts the first MH epoch following an SH epoch, or None."""
    for before, after in itertools.pairwise(history):
        if before.get("phase") == "SH" and after.get("phase") == "MH":
            return int(before["step"]) + 1
    return None


def _series(history: list[dict[str, Any]], steps: list[dict[str, Any]], stat: str | None) -> Series:
    """Values against the global step: the per-step loss (``stat`` None) or step statistic from
    steps.jsonl, else the epoch means of history.json (``train/loss``, ``train/<stat>``)."""
    from_steps = [(s["step"], s["loss"] if stat is None else s["stats"].get(stat)) for s in steps]
    points = [(x, y) for x, y in from_steps if is_finite_number(y)]
    if not points:
        key = "train/loss" if stat is None else f"train/{stat}"
        points = [(h["step"], h[key]) for h in history if is_finite_number(h.get(key))]
    return [float(x) for x, _ in points], [float(y) for _, y in points]


def _figure(panels: int, height: float = 3.5, columns: int | None = None) -> tuple[Any, list[Any]]:
    """A Figure on an Agg canvas with ``panels`` axes side by side, ``columns`` a row at most (default: one
    row); axes of an unfilled last row are removed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = min(panels, columns or panels)
    rows = -(-panels // cols)
    fig = Figure(figsize=(5 * cols, height * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(rows, cols, squeeze=False).ravel())
    for spare in axes[panels:]:
        spare.remove()
    return fig, axes[:panels]


def _mark_switch(ax: Any, x: float | None) -> None:
    if x is not None:
        ax.axvline(x, color="tab:red", linestyle="--", linewidth=1, label=SWITCH_LABEL)


def loss_figure(history: list[dict[str, Any]], steps: list[dict[str, Any]]) -> Any:
    """Train loss per logged step (log scale: SH and MH losses differ by about the batch size), epoch means
    as dots, the SH → MH switch as a dashed line at its first step. None without any loss."""
    x, y = _series(history, steps, None)
    if not x:
        return None
    fig, (ax,) = _figure(1, height=4)
    ax.plot(x, y, linewidth=1, label="loss (logged steps)" if steps else "loss (epoch mean)")
    means = [(h["step"], h["train/loss"]) for h in history if is_finite_number(h.get("train/loss"))]
    if steps and means:
        ax.plot([s for s, _ in means], [v for _, v in means], "o", label="epoch mean")
    if min(y) > 0:
        ax.set_yscale("log")
    _mark_switch(ax, phase_switch_step(history))
    ax.set(xlabel="global step", ylabel="train loss", title="training loss")
    ax.legend()
    return fig


VAL_FAMILIES = {  # metric name without its direction prefix and K → (panel position, title, y-axis label)
    "rsum": (0, "rsum", "sum of R@1, R@5, R@10 (both directions)"),
    "top": (1, "top-1 accuracy", "top-1 accuracy (%)"),
    "r": (2, "recall@K", "recall@K (%)"),
    "p": (3, "precision@k", "precision@k (%)"),
    "map": (4, "mAP@k", "mAP@k (%)"),
    "nmi": (5, "NMI", "NMI (%)"),
    "nn": (6, "1-NN accuracy", "1-NN accuracy (%)"),
    "medr": (7, "median rank (lower is better)", "median rank"),
    "meanr": (8, "mean rank (lower is better)", "mean rank"),
}


def _val_family(name: str) -> tuple[int, str, str]:
    """Panel of a validation metric, as (position, title, y-axis label): one metric family per panel, whatever
    the direction or prefix (``i2t_r1``, ``t2i_r5`` and ``r8`` are recall@K; ``min_dim_rsum`` is rsum); an
    unknown metric gets a panel of its own."""
    metric = name.rpartition("_")[2]
    family = re.sub(r"\d+$", "", metric)
    return VAL_FAMILIES.get(family, (len(VAL_FAMILIES), metric, metric))


def _natural(name: str) -> list[Any]:
    """Sort key that puts r5 before r10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def val_figure(history: list[dict[str, Any]]) -> Any:
    """Every ``val/*`` metric per epoch, one metric family per panel (:func:`_val_family`; at most three panels
    a row), each series in the legend; the first MH epoch is marked half an epoch before its point. None
    without validation metrics."""
    names = {k[4:] for h in history for k, v in h.items() if k.startswith("val/") and is_finite_number(v)}
    if not names:
        return None
    groups: dict[tuple[int, str, str], list[str]] = {}
    for name in sorted(names, key=_natural):
        groups.setdefault(_val_family(name), []).append(name)
    switch = phase_switch_step(history)
    first_mh = next(h["epoch"] for h in history if h["step"] >= switch) if switch else None
    fig, axes = _figure(len(groups), columns=3)
    for ax, group in zip(axes, sorted(groups), strict=False):
        for name in groups[group]:
            points = [
                (h["epoch"], h[f"val/{name}"]) for h in history if is_finite_number(h.get(f"val/{name}"))
            ]
            ax.plot([e for e, _ in points], [v for _, v in points], "o-", label=name)
        _mark_switch(ax, None if first_mh is None else first_mh - 0.5)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set(xlabel="epoch", ylabel=group[2], title=f"val {group[1]}")
        ax.legend(fontsize="small")
    return fig


def negatives_figure(history: list[dict[str, Any]], steps: list[dict[str, Any]]) -> Any:
    """Hardest-negative similarity and the fraction of hardest negatives owned by another rank, per logged
    step (else per epoch). None when the run logged neither (SH only, or the labels task)."""
    series = {stat: _series(history, steps, stat) for stat in NEGATIVE_STATS}
    series = {stat: xy for stat, xy in series.items() if xy[0]}
    if not series:
        return None
    fig, axes = _figure(len(series))
    for ax, (stat, (x, y)) in zip(axes, series.items(), strict=False):
        ax.plot(x, y, linewidth=1, label=f"{stat} ({'logged steps' if steps else 'epoch mean'})")
        _mark_switch(ax, phase_switch_step(history))
        ax.set(xlabel="global step", ylabel=NEGATIVE_STAT_UNITS[stat], title=stat)
        ax.legend(fontsize="small")
    return fig


def gradient_variance_figure(history: list[dict[str, Any]]) -> Any:
    """Normalized gradient variance of the SGD and GC mini-batch estimators per epoch (the epoch's mean of
    the variance meter's measurements) and GC's total distortion. None without gradient clustering."""
    rows = [m for m in history if "gvar/sgd_nvar" in m]
    if not rows:
        return None
    fig, axes = _figure(2)
    x = [m["step"] for m in rows]
    for key, label in (("gvar/sgd_nvar", "SGD"), ("gvar/gc_nvar", "GC (stratified)")):
        axes[0].plot(x, [m[key] for m in rows], marker="o", label=label)
    axes[0].set(
        xlabel="global step", ylabel="normalized variance", title="normalized gradient variance", yscale="log"
    )
    axes[0].legend()
    axes[1].plot(
        x, [m.get("gvar/gc_distortion", float("nan")) for m in rows], marker="o", label="GC (stratified)"
    )
    axes[1].set(xlabel="global step", ylabel="total distortion", title="GC total distortion")
    axes[1].legend()
    return fig


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write ``loss.png``, ``val.png``, ``negatives.png`` and ``gradient_variance.png`` (those with data)
    into ``out_dir`` (default: ``<run_dir>/plots``); returns the files written."""
    history, steps = load_run(run_dir)
    out = Path(out_dir) if out_dir else Path(run_dir) / PLOTS_DIR
    figures = {
        "loss.png": loss_figure(history, steps),
        "val.png": val_figure(history),
        "negatives.png": negatives_figure(history, steps),
        "gradient_variance.png": gradient_variance_figure(history),
    }
    return _save({name: fig for name, fig in figures.items() if fig is not None}, out)


def _save(figures: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=100)
        paths.append(out / name)
    return paths


def _trial_reports(trial: Path) -> list[dict[str, Any]]:
    """A Tune trial's reports: result.json (one JSON object a line), else progress.csv."""
    if (trial / "result.json").is_file():
        lines = (trial / "result.json").read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]
    if (trial / "progress.csv").is_file():
        with (trial / "progress.csv").open(newline="") as f:
            return [{k: _csv_value(v) for k, v in row.items()} for row in csv.DictReader(f)]
    return []


def _csv_value(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def _sweep_space(experiment_dir: Path) -> SweepSpace | None:
    """The space a sweep folder was run with (its raydist_sweep.yaml); None for a folder without one."""
    import yaml

    path = experiment_dir / SWEEP_FILE
    if not path.is_file():
        return None
    saved = yaml.safe_load(path.read_text())
    return parse_space(saved["space"], name=saved["name"])


def _sweep_mode(experiment_dir: Path) -> str:
    """``mode`` of the sweep's space, "max" when the folder has no sweep file."""
    space = _sweep_space(experiment_dir)
    return space.mode if space else "max"


def plot_folder(
    folder: str | Path, metric: str | None = None, out_dir: str | Path | None = None
) -> list[Path]:
    """Plot a sweep folder (:func:`plot_sweep` on ``metric``, default the sweep's own) or a run folder
    (:func:`plot_run`); returns the files written."""
    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such run or sweep folder")
    space = _sweep_space(folder)
    if space is None:
        return plot_run(folder, out_dir=out_dir)
    return plot_sweep(folder, metric or space.metric, out_dir=out_dir)


def sweep_best(
    experiment_dir: str | Path, metric: str, mode: str | None = None
) -> list[tuple[dict[str, Any], float]]:
    """``(searched values, best finite metric)`` of every ``trial_*`` folder that reported ``metric``; the
    best is the max (or min, per ``mode``, default: the sweep file's)."""
    experiment_dir = Path(experiment_dir)
    trials = sorted(p for p in experiment_dir.glob("trial_*") if p.is_dir())
    if not trials:
        raise FileNotFoundError(f"{experiment_dir}: no trial_* folders (not a raydist Tune sweep folder)")
    pick = min if (mode or _sweep_mode(experiment_dir)) == "min" else max
    rows = []
    for trial in trials:
        params = trial / "params.json"
        values = [r[metric] for r in _trial_reports(trial) if is_finite_number(r.get(metric))]
        if values and params.is_file():
            rows.append((json.loads(params.read_text()), float(pick(values))))
    return rows


def plot_sweep(
    experiment_dir: str | Path, metric: str, *, mode: str | None = None, out_dir: str | Path | None = None
) -> list[Path]:
    """One scatter per searched key: each trial's best ``metric`` against its value of the key (a log axis
    for positive numbers spanning ≥ 100×; non-numeric values as categories). Files ``sweep-<key>.png`` in
    ``out_dir`` (default ``<experiment_dir>/plots``); returns them."""
    rows = sweep_best(experiment_dir, metric, mode)
    if not rows:
        raise ValueError(f"{experiment_dir}: no trial reported a finite {metric!r}")
    figures = {}
    for key in sorted({k for values, _ in rows for k in values}):
        points = [(values[key], best) for values, best in rows if key in values]
        fig, (ax,) = _figure(1, height=4)
        xs = [x for x, _ in points]
        label = f"trial (best {metric})"
        if all(is_finite_number(x) for x in xs):
            ax.scatter(xs, [y for _, y in points], label=label)
            if min(xs) > 0 and max(xs) >= 100 * min(xs):
                ax.set_xscale("log")
        else:
            labels = sorted({str(x) for x in xs})
            ax.scatter([labels.index(str(x)) for x in xs], [y for _, y in points], label=label)
            ax.set_xticks(range(len(labels)), labels)
        ax.set(xlabel=key, ylabel=f"best {metric}", title=f"{metric} by {key} ({len(points)} trials)")
        ax.legend(fontsize="small")
        figures[f"sweep-{re.sub(r'[^A-Za-z0-9_.-]+', '_', key)}.png"] = fig
    return _save(figures, Path(out_dir) if out_dir else Path(experiment_dir) / PLOTS_DIR)
