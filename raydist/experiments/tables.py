"""Seed statistics and markdown tables for experiment summaries."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Spread:
    """Mean, sample standard deviation (0 for one value), min, max and count of the finite values."""

    mean: float
    std: float
    low: float
    high: float
    n: int

    def cell(self, digits: int = 1) -> str:
        """``61.3 ± 1.2`` (± the std over seeds), ``61.3`` for one value, ``-`` for none."""
        if self.n == 0:
            return "-"
        return f"{self.mean:.{digits}f}" + (f" ± {self.std:.{digits}f}" if self.n > 1 else "")


def spread(values: Iterable[float]) -> Spread:
    """:class:`Spread` of the finite ``values`` (NaN entries, e.g. a failed trial's, are left out)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return Spread(math.nan, math.nan, math.nan, math.nan, 0)
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return Spread(mean, std, min(xs), max(xs), len(xs))


def clearly_above(a: Spread, b: Spread) -> bool:
    """``a`` beats ``b`` by more than two standard errors of the difference of the means
    (``2·√(s_a²/n_a + s_b²/n_b)``); with one seed each, any positive difference."""
    if a.n == 0 or b.n == 0:
        return False
    return a.mean - b.mean > 2 * math.sqrt(a.std**2 / a.n + b.std**2 / b.n)


def group_by(items: Iterable[T], key: Callable[[T], Hashable]) -> dict[Any, list[T]]:
    """Items grouped by ``key`` (keys must sort: numbers, strings or tuples of them), in key order."""
    groups: dict[Any, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return {k: groups[k] for k in sorted(groups)}


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; numbers right-aligned, everything else left-aligned."""

    def align(i: int) -> str:
        numeric = rows and all(_numeric(row[i]) for row in rows)
        return "---:" if numeric else "---"

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align(i) for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _numeric(cell: Any) -> bool:
    text = str(cell).split(" ± ")[0].lstrip("+-")
    return text == "-" or text.replace(".", "", 1).isdigit()
