"""Figures of experiment summaries: matplotlib on the Agg canvas (imported lazily, no pyplot state), lines
of the mean over seeds with the seeds' min–max band."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raydist.experiments.tables import spread


def panels(rows: int, cols: int, *, width: float = 5.0, height: float = 3.8) -> tuple[Any, list[Any]]:
    """A figure with ``rows × cols`` axes (flattened, row-major) on an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, list(fig.subplots(rows, cols, squeeze=False).ravel())


def spread_line(
    ax: Any, xs: Sequence[float], samples: Sequence[Sequence[float]], label: str, **style: Any
) -> None:
    """The mean of each x's ``samples`` (one value per seed) as a line with markers, and the min–max over
    seeds as a shaded band (x values without a finite sample are left out)."""
    points = [(x, spread(s)) for x, s in zip(xs, samples, strict=False)]
    points = [(x, s) for x, s in points if s.n]
    if not points:
        return
    x = [p[0] for p in points]
    (line,) = ax.plot(x, [p[1].mean for p in points], label=label, **{"marker": "o", **style})
    if any(p[1].n > 1 for p in points):
        ax.fill_between(
            x,
            [p[1].low for p in points],
            [p[1].high for p in points],
            color=line.get_color(),
            alpha=0.18,
            linewidth=0,
        )


def finish(ax: Any, *, title: str, xlabel: str, ylabel: str, legend: bool = True) -> None:
    """Title, axis labels, a light grid and the legend."""
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def save(fig: Any, path: Path) -> Path:
    """Write ``fig`` as a small PNG for docs/figures: 100 dpi, quantised to a 128-colour palette (about a
    quarter of the full-colour size; Pillow comes with matplotlib)."""
    from PIL import Image

    fig.set_dpi(100)
    fig.canvas.draw()
    image = Image.frombuffer("RGBA", fig.canvas.get_width_height(physical=True), fig.canvas.buffer_rgba())
    image.convert("RGB").quantize(128).save(path, optimize=True)
    return path
