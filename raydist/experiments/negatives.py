"""``negatives``: the negative-set size n of MH has an interior optimum (VSE++ thesis Fig. 3.6) — too few
negatives are too easy, too many make the hardest one a near-duplicate or a false negative.

Every trial takes the same number of optimizer steps with the same query batch B: a size n > B embeds n
rows per step, so an epoch holds fewer steps; those trials run proportionally more epochs (and SH warm-up
epochs). Sizes are grouped by rows per step, one sweep per group."""

from __future__ import annotations

import math
from pathlib import Path

from raydist.experiments.catalog import register_experiment
from raydist.experiments.figures import finish, panels, save, spread_line
from raydist.experiments.records import TrialRecord
from raydist.experiments.spec import IN_PROCESS, Experiment, Setup, Summary, Sweep
from raydist.experiments.tables import Spread, clearly_above, group_by, markdown_table, spread
from raydist.train.plan import step_plan

SIZES = (2, 8, 32, 128, 512, 2048)
QUICK_SIZES = (8, 64)  # one sweep (64 = the quick batch); the grouping is unit-tested
KEY = "loss.negative_set_size"


def steps_per_epoch(train_rows: int, rows_per_step: int) -> int:
    """Full steps an epoch of ``train_rows`` holds (the in-memory split drops the remainder)."""
    return train_rows // rows_per_step


def run_sizes(setup: Setup) -> tuple[list[int], list[int]]:
    """(sizes run, sizes left out): a size whose rows per step exceed the train split cannot run one step;
    the summary names the sizes left out."""
    sizes = QUICK_SIZES if setup.quick else SIZES
    fits = [n for n in sizes if max(n, setup.base.train.batch_size) <= setup.train_rows]
    if not fits:
        raise ValueError(
            f"every negative-set size {sizes} needs more rows per step than the train split "
            f"holds ({setup.train_rows} rows)"
        )
    return fits, [n for n in sizes if n not in fits]


def sweeps(setup: Setup) -> list[Sweep]:
    """One sweep per rows-per-step group; a group embedding r rows per step runs
    ``ceil(E · steps(B) / steps(r))`` epochs (and the SH warm-up scaled alike), E = ``train.epochs``.
    Sizes larger than the train split are left out (:func:`run_sizes`)."""
    base = setup.base
    sizes, _ = run_sizes(setup)
    batch_steps = steps_per_epoch(setup.train_rows, step_plan(base, "pairs").rows_per_step)
    groups = group_by(sizes, lambda n: max(n, base.train.batch_size))
    out = []
    for rows, members in groups.items():
        steps = steps_per_epoch(setup.train_rows, rows)
        if steps < 1:
            raise ValueError(f"negative set {rows} is larger than the train split ({setup.train_rows} rows)")
        scale = batch_steps / steps
        overrides = (
            {}
            if rows == base.train.batch_size
            else {
                "train.epochs": math.ceil(base.train.epochs * scale),
                "loss.warmup_sh_epochs": math.ceil(base.loss.warmup_sh_epochs * scale),
            }
        )
        out.append(Sweep(label=f"rows{rows}", overrides=overrides, grid={KEY: members}))
    return out


def summarise(records: list[TrialRecord], out: Path, setup: Setup) -> Summary:
    """Table of val/test R@1 and rsum per size (mean ± std over seeds); figure of rsum and R@1 vs size."""
    by_size = group_by([r for r in records if r.history], lambda r: r.config[KEY])
    rows, table = [], []
    for n, trials in by_size.items():
        cfg = trials[0].config
        stats = {
            "val_rsum": spread(r.val("rsum") for r in trials),
            "val_i2t_r1": spread(r.val("i2t_r1") for r in trials),
            "val_t2i_r1": spread(r.val("t2i_r1") for r in trials),
            "test_rsum": spread(r.test.get("rsum", math.nan) for r in trials),
            "test_i2t_r1": spread(r.test.get("i2t_r1", math.nan) for r in trials),
            "test_t2i_r1": spread(r.test.get("t2i_r1", math.nan) for r in trials),
            "wall_s": spread(r.last("time_total_s") for r in trials),
        }
        steps = int(trials[0].last("step"))
        rows.append(
            {
                "negative_set_size": n,
                "epochs": cfg["train.epochs"],
                "steps": steps,
                "seeds": len(trials),
                **{k: vars(s) for k, s in stats.items()},
            }
        )
        table.append(
            [
                n,
                max(n, cfg["train.batch_size"]),
                cfg["train.epochs"],
                steps,
                *(
                    stats[k].cell()
                    for k in (
                        "val_i2t_r1",
                        "val_t2i_r1",
                        "val_rsum",
                        "test_i2t_r1",
                        "test_t2i_r1",
                        "test_rsum",
                    )
                ),
                stats["wall_s"].cell(0),
            ]
        )
    header = [
        "n",
        "rows/step",
        "epochs",
        "steps",
        "val i2t R@1",
        "val t2i R@1",
        "val rsum",
        "test i2t R@1",
        "test t2i R@1",
        "test rsum",
        "wall s",
    ]
    figure = _plot(by_size, out / "negatives.png", setup.base.train.batch_size)
    return Summary(rows, markdown_table(header, table), {"negatives": figure}, _verdict(by_size, setup))


def _plot(by_size: dict[int, list[TrialRecord]], path: Path, batch: int) -> Path:
    fig, (ax_rsum, ax_r1) = panels(1, 2)
    sizes = list(by_size)
    for split in ("val", "test"):
        pick = (lambda r, k: r.val(k)) if split == "val" else (lambda r, k: r.test.get(k, math.nan))
        spread_line(ax_rsum, sizes, [[pick(r, "rsum") for r in by_size[n]] for n in sizes], f"{split} rsum")
        for key in ("i2t_r1", "t2i_r1"):
            spread_line(
                ax_r1,
                sizes,
                [[pick(r, key) for r in by_size[n]] for n in sizes],
                f"{split} {key}",
                linestyle="-" if split == "test" else "--",
            )
    for ax, metric in ((ax_rsum, "rsum"), (ax_r1, "R@1 (%)")):
        ax.set_xscale("log", base=2)
        ax.axvline(batch, color="grey", linestyle=":", label=f"query batch {batch}")
        finish(ax, title=f"{metric} vs negative-set size n", xlabel="negative-set size n", ylabel=metric)
    return save(fig, path)


def _verdict(by_size: dict[int, list[TrialRecord]], setup: Setup) -> list[str]:
    """Interior optimum: the best size by mean test rsum is neither the smallest nor the largest, and beats
    both ends by more than two standard errors."""
    test = {n: spread(r.test.get("rsum", math.nan) for r in trials) for n, trials in by_size.items()}
    test = {n: s for n, s in test.items() if s.n}
    lines = (
        _optimum(test)
        if len(test) >= 3
        else [f"not enough sizes with results ({sorted(test)}) to look for an interior optimum"]
    )
    left_out = run_sizes(setup)[1]
    if left_out:
        lines.append(
            f"Not run: n = {', '.join(map(str, left_out))} (more rows per step than the "
            f"{setup.train_rows} train rows)."
        )
    return lines


def _optimum(test: dict[int, Spread]) -> list[str]:
    sizes = sorted(test)
    best = max(sizes, key=lambda n: test[n].mean)
    ends = (sizes[0], sizes[-1])
    interior = best not in ends and all(clearly_above(test[best], test[e]) for e in ends)
    why = (
        ""
        if interior
        else " (the best size is an end of the range)"
        if best in ends
        else " (the peak is within two standard errors of an end)"
    )
    return [
        f"test rsum peaks at n={best} ({test[best].cell()}); n={ends[0]}: {test[ends[0]].cell()}, "
        + f"n={ends[1]}: {test[ends[1]].cell()}.",
        f"Interior optimum: {'held' if interior else 'did not hold'}{why}.",
    ]


EXPERIMENT = register_experiment(
    Experiment(
        name="negatives",
        claim="MH's negative-set size has an interior optimum",
        reference="Faghri, VSE++ thesis (2018), Fig. 3.6; raydist.distributed.negatives",
        task="pairs",
        space="negative_set_size",
        sweeps=sweeps,
        summarise=summarise,
        quick={"train.epochs": 2, "loss.warmup_sh_epochs": 1, "train.batch_size": 64, **IN_PROCESS},
    )
)
