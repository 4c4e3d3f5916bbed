"""``matryoshka``: a nested model (Matryoshka loss on every prefix in ``model.nesting``) retrieves better at
each low dim m than a plain model of the same steps reduced to m dims — its first m dims, an SVD to m, or a
random (JL) projection to m (Kusupati et al. 2022, Fig. 2/3). Scored on the test split with
:func:`raydist.eval.retrieve.retrieval_report` (single-shot rows of the nested model, baseline rows of the
plain one), per seed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from raydist.experiments.catalog import register_experiment
from raydist.experiments.figures import finish, panels, save, spread_line
from raydist.experiments.records import TrialRecord
from raydist.experiments.spec import IN_PROCESS, Experiment, Setup, Summary, Sweep
from raydist.experiments.tables import clearly_above, group_by, markdown_table, spread

NESTING = "model.nesting"
METHODS = {
    "single": "nested",
    "first-m": "plain, first m dims",
    "svd": "plain, SVD to m",
    "jl": "plain, random JL to m",
}
METRICS = ("i2t_r1", "t2i_r1", "rsum")


def sweeps(setup: Setup) -> list[Sweep]:
    """The space file as it is (nested and plain, per seed); quick mode nests two dims."""
    return [Sweep(grid={NESTING: [[], [16, 128]]} if setup.quick else {})]


def retrieval_rows(records: list[TrialRecord], out: Path, data_dir: Path) -> list[dict[str, Any]]:
    """Per seed with a nested and a plain checkpoint: the nested model's single-shot rows at its trained
    dims and the plain model's baseline rows at the same dims (``checkpoint_retrieval_report`` on the test split; its
    own table and figures go to ``out/retrieval/seed<s>``)."""
    from raydist.retrieval.trained import checkpoint_retrieval_report

    rows = []
    for seed, trials in group_by(
        [r for r in records if r.checkpoint], lambda r: r.config["train.seed"]
    ).items():
        nested = next((r for r in trials if r.config[NESTING]), None)
        plain = next((r for r in trials if not r.config[NESTING]), None)
        if nested is None or plain is None:
            continue
        report = checkpoint_retrieval_report(
            nested.checkpoint,
            data_dir,
            split="test",
            dims=nested.config[NESTING],
            baseline_checkpoint=plain.checkpoint,
            out_dir=out / "retrieval" / f"seed{seed}",
        )
        rows += [
            {**row, "seed": seed}
            for row in report["rows"]
            if row["method"] in METHODS and not row.get("interpolated")
        ]
    return rows


def summarise(records: list[TrialRecord], out: Path, setup: Setup) -> Summary:
    """Table of R@1 and rsum per dim and method (mean ± std over seeds) and figure of both vs dim."""
    rows = retrieval_rows(records, out, setup.data_dir)
    cells = group_by(rows, lambda r: (r["dim"], list(METHODS).index(r["method"])))
    table = [
        [dim, METHODS[list(METHODS)[m]], *(spread(r.get(k, math.nan) for r in cell).cell() for k in METRICS)]
        for (dim, m), cell in cells.items()
    ]
    header = ["dim m", "model", "test i2t R@1", "test t2i R@1", "test rsum"]
    return Summary(
        rows,
        markdown_table(header, table),
        {"matryoshka": _plot(rows, out / "matryoshka.png")},
        _verdict(rows),
    )


def _plot(rows: list[dict[str, Any]], path: Path) -> Path:
    fig, axes = panels(1, 2)
    dims = sorted({r["dim"] for r in rows})
    for ax, metric in zip(axes, ("rsum", "t2i_r1"), strict=False):
        for method, label in METHODS.items():
            samples = [[r[metric] for r in rows if r["method"] == method and r["dim"] == d] for d in dims]
            spread_line(ax, dims, samples, label)
        ax.set_xscale("log", base=2)
        finish(ax, title=f"test {metric} vs dimension m", xlabel="dimension m", ylabel=metric)
    return save(fig, path)


def _verdict(rows: list[dict[str, Any]]) -> list[str]:
    """At every dim below the full one: nested rsum vs the best baseline; at the full dim: nested vs plain."""
    if not rows:
        return ["no seed finished both a nested and a plain trial: nothing to compare"]
    rsum = {
        (m, d): spread(r["rsum"] for r in rows if r["method"] == m and r["dim"] == d)
        for m in METHODS
        for d in {r["dim"] for r in rows}
    }
    full = max(d for _, d in rsum)
    lines, wins = [], []
    for d in sorted({d for _, d in rsum if d < full}):
        baselines = {m: rsum[(m, d)] for m in METHODS if m != "single" and rsum[(m, d)].n}
        if not baselines or not rsum[("single", d)].n:
            continue
        best = max(baselines, key=lambda m: baselines[m].mean)
        wins.append(clearly_above(rsum[("single", d)], baselines[best]))
        lines.append(
            f"m={d}: nested rsum {rsum[('single', d)].cell()} vs best baseline {METHODS[best]} "
            f"{baselines[best].cell()}{' (clearly better)' if wins[-1] else ''}."
        )
    if wins:
        lines.append(
            f"Nested beats every baseline at every low dim: {'held' if all(wins) else 'did not hold'} "
            f"({sum(wins)} of {len(wins)} dims clearly better than the best baseline)."
        )
    for m in (m for m in METHODS if m != "single"):
        low = [
            d for d in sorted({d for _, d in rsum if d < full}) if rsum[(m, d)].n and rsum[("single", d)].n
        ]
        better = [d for d in low if clearly_above(rsum[("single", d)], rsum[(m, d)])]
        lines.append(
            f"vs {METHODS[m]}: nested clearly better at m = {', '.join(map(str, better)) or 'none'} "
            f"of {', '.join(map(str, low))}."
        )
    lines.append(
        f"At the full dim {full}: nested {rsum[('single', full)].cell()}, plain "
        f"{rsum[('first-m', full)].cell()} rsum (the cost of nesting at full size)."
    )
    return lines


EXPERIMENT = register_experiment(
    Experiment(
        name="matryoshka",
        claim="a nested model beats first-m, SVD and random projections of a plain model at every low dim",
        reference="Kusupati et al., Matryoshka Representation Learning (NeurIPS 2022), Fig. 2-3; raydist.eval.retrieve",
        task="pairs",
        space="matryoshka",
        sweeps=sweeps,
        summarise=summarise,
        quick={"train.epochs": 1, **IN_PROCESS},
    )
)
