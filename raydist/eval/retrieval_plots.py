"""Text table and figures of the rows of :mod:`raydist.eval.retrieve`: metric vs dimension (nested vs
baselines) and metric vs MFLOPs/query (single-shot vs adaptive vs funnel). matplotlib is imported lazily
and draws on the Agg canvas (no pyplot state, no display)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROW_KEYS = ("method", "dim", "cascade", "shortlists")
NOT_SHOWN = ("interpolated", "shortlist_dim")  # shown through the dim's * and the cascade column
COST_SUFFIXES = ("mflops", "ms_per_query")
DIM_METHODS = {
    "single": "nested (single-shot)",
    "first-m": "first m dims",
    "svd": "SVD to m",
    "jl": "random JL to m",
}
COST_METHODS = {"single": "single-shot", "adaptive": "adaptive (D_s > D_r)", "funnel": "funnel"}


def main_metric(two_way: bool, k: int = 10) -> str:
    """The metric plotted against dimension: ``rsum`` for a two-way set (image–caption), else ``map{k}``."""
    return "rsum" if two_way else f"map{k}"


def cost_panels(two_way: bool, k: int = 10) -> list[tuple[str, str]]:
    """(metric, cost key) per panel of the MFLOPs figure: one per direction for a two-way set (R@1 of t2i,
    i2t), else mAP@k."""
    if two_way:
        return [("t2i_r1", "t2i_mflops"), ("i2t_r1", "i2t_mflops")]
    return [(f"map{k}", "mflops")]


def _cell(key: str, row: dict[str, Any]) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    if key == "dim":
        return f"{value}*" if row.get("interpolated") else str(value)
    if isinstance(value, str):
        return value
    if key.endswith("mflops"):
        return f"{value:.4g}"
    return f"{value:.4f}" if key.endswith("ms_per_query") else f"{value:.1f}"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per row: method, dim, cascade, shortlists, then the metrics (%), then MFLOPs/query and wall
    ms/query, in first-seen key order; ``-`` where a row lacks a column, ``*`` marks an interpolated dim."""
    metrics: list[str] = []
    costs: list[str] = []
    for row in rows:
        for key in row:
            if key in ROW_KEYS or key in NOT_SHOWN or key in metrics or key in costs:
                continue
            (costs if key.endswith(COST_SUFFIXES) else metrics).append(key)
    columns = [key for key in ROW_KEYS if any(key in row for row in rows)] + metrics + costs
    cells = [[_cell(key, row) for key in columns] for row in rows]
    widths = [max(len(key), *(len(line[i]) for line in cells)) for i, key in enumerate(columns)]
    lines = [
        "  ".join(text.rjust(w) for text, w in zip(line, widths, strict=False)) for line in [columns, *cells]
    ]
    if any(row.get("interpolated") for row in rows):
        lines.append("* interpolated dim: the geometric midpoint of two neighbouring evaluated dims")
    return "\n".join(lines)


def _axes(panels: int) -> tuple[Any, list[Any]]:
    """A figure on an Agg canvas with ``panels`` side-by-side axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5 * panels, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, list(fig.subplots(1, panels, squeeze=False)[0])


def plot_metric_vs_dim(rows: Sequence[dict[str, Any]], path: str | Path, metric: str) -> Path:
    """``metric`` against dimension (log₂ x), one line per method (nested single-shot and the baselines);
    interpolated dims of the nested model are ringed. Written as PNG to ``path``."""
    fig, (ax,) = _axes(1)
    for method, label in DIM_METHODS.items():
        points = sorted(
            (row["dim"], row[metric]) for row in rows if row["method"] == method and metric in row
        )
        if points:
            ax.plot(*zip(*points, strict=False), marker="o", label=label)
    rings = [(row["dim"], row[metric]) for row in rows if row.get("interpolated") and metric in row]
    if rings:
        ax.scatter(
            *zip(*rings, strict=False),
            s=110,
            facecolors="none",
            edgecolors="black",
            label="interpolated dim",
            zorder=3,
        )
    ax.set_xscale("log", base=2)
    ax.set(xlabel="dimension", ylabel=metric, title=f"{metric} vs dimension")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=120)
    return Path(path)


def plot_metric_vs_mflops(
    rows: Sequence[dict[str, Any]], path: str | Path, panels: Sequence[tuple[str, str]]
) -> Path:
    """Per ``(metric, cost key)`` panel: metric against MFLOPs/query (log x) for single-shot (labelled by
    dim), adaptive (by ``D_s>D_r``) and funnel (by cascade) rows. Written as PNG to ``path``."""
    fig, axes = _axes(len(panels))
    for ax, (metric, cost) in zip(axes, panels, strict=False):
        for method, label in COST_METHODS.items():
            points = sorted(
                (row[cost], row[metric], row.get("cascade", str(row["dim"])))
                for row in rows
                if row["method"] == method and metric in row and cost in row
            )
            if not points:
                continue
            xs, ys, _ = zip(*points, strict=False)
            ax.plot(xs, ys, marker="o", linestyle="-" if method != "funnel" else "none", label=label)
            for x, y, name in points:
                ax.annotate(name, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
        ax.set(xscale="log", xlabel=f"{cost} (MFLOPs per query)", ylabel=metric, title=f"{metric} vs cost")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.savefig(path, dpi=120)
    return Path(path)
