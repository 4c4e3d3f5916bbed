"""``negatives-beyond-batch``: negatives from outside the step's batch -- a memory of past global batches (MoCo,
He et al. 2020; XBM, Wang et al. 2020: ``loss.memory_size``) or hard negatives mined from the whole train split
(ANCE, Xiong et al. 2021: ``loss.mined_negatives``) -- raise MH's retrieval over in-batch negatives alone, at the
same batch, steps and schedule (issue #47); for the ranking loss (MH) and for InfoNCE, whose memory is MoCo's."""

from __future__ import annotations

import math
from pathlib import Path

from raydist.experiments.catalog import register_experiment
from raydist.experiments.figures import finish, panels, save
from raydist.experiments.records import TrialRecord
from raydist.experiments.spec import IN_PROCESS, Experiment, Setup, Summary, Sweep
from raydist.experiments.tables import Spread, clearly_above, group_by, markdown_table, spread

MEMORY, MINED, KIND, BATCH = "loss.memory_size", "loss.mined_negatives", "loss.kind", "train.batch_size"
MINING = {MINED: 4, "loss.mine_every": 50, "loss.mine_range": [10, 100]}
INFONCE = {KIND: "infonce"}
MULTIPLES = (0, 1, 4, 16)  # memory sizes as multiples of the global batch (issue #47)
QUICK_MULTIPLES = (0, 4)
LOSSES = ("ranking", "infonce")


def memory_sizes(setup: Setup) -> tuple[list[int], list[int]]:
    """(sizes run, sizes left out): ``MULTIPLES`` × ``train.batch_size`` (quick mode: ``QUICK_MULTIPLES``); a
    memory larger than the train split the run reads is refused by the run plan
    (:func:`raydist.train.plan.check_memory_size`), so such sizes are left out and the summary names them."""
    batch = setup.base.train.batch_size
    sizes = [m * batch for m in (QUICK_MULTIPLES if setup.quick else MULTIPLES)]
    train = int(setup.train_rows * setup.base.data.train_fraction)
    return [s for s in sizes if s <= train], [s for s in sizes if s > train]


def sweeps(setup: Setup) -> list[Sweep]:
    """Per loss (ranking, InfoNCE): in-batch negatives and the memory sizes of :func:`memory_sizes`, then the
    mined arm (no memory)."""
    memory = {MEMORY: memory_sizes(setup)[0]}
    return [
        Sweep(label="memory", grid=memory),
        Sweep(label="mined", overrides=MINING, grid={MEMORY: [0]}),
        Sweep(label="infonce-memory", overrides=INFONCE, grid=memory),
        Sweep(label="infonce-mined", overrides={**INFONCE, **MINING}, grid={MEMORY: [0]}),
    ]


def arm_key(record: TrialRecord) -> tuple[str, int, int]:
    """(the loss kind, mined negatives per sample, memory rows): sorts in-batch, the memory sizes, then mined."""
    kind = record.config.get(KIND, "auto")
    return "ranking" if kind == "auto" else kind, record.config.get(MINED) or 0, record.config.get(MEMORY, 0)


def arm_name(mined: int, size: int, batch: int) -> str:
    """``in-batch``, ``memory 512 (4×)`` or ``mined 4``."""
    if mined:
        return f"mined {mined}"
    return f"memory {size} ({size / batch:g}×)" if size else "in-batch"


def summarise(records: list[TrialRecord], out: Path, setup: Setup) -> Summary:
    """Test R@1 (i2t, t2i) and rsum, best val rsum and wall time per arm (mean ± std over seeds); the figure of
    test rsum vs memory size per loss (:func:`_plot`)."""
    groups = group_by([r for r in records if r.history], arm_key)
    rows, table, test = [], [], {}
    for key, trials in groups.items():
        kind, mined, size = key
        name = arm_name(mined, size, trials[0].config.get(BATCH, setup.base.train.batch_size))
        stats = {k: spread(r.test.get(k, math.nan) for r in trials) for k in ("i2t_r1", "t2i_r1", "rsum")}
        val = spread(r.val("rsum") for r in trials)
        wall = spread(r.last("time_total_s") for r in trials)
        test[key] = stats["rsum"]
        rows.append(
            {
                "loss": kind,
                "arm": name,
                "memory_size": size,
                "mined_negatives": mined,
                "seeds": len(trials),
                "steps": [int(r.last("step")) for r in trials],
                **{f"test_{k}": vars(s) for k, s in stats.items()},
            }
        )
        table.append([kind, name, *(s.cell() for s in stats.values()), val.cell(), wall.cell(0)])
    header = ["loss", "negatives", "test i2t R@1", "test t2i R@1", "test rsum", "best val rsum", "wall s"]
    figure = _plot(test, out / "negatives_beyond_batch.png", setup.base.train.batch_size)
    return Summary(
        rows, markdown_table(header, table), {"negatives_beyond_batch": figure}, _verdict(test, setup)
    )


def _plot(test: dict[tuple[str, int, int], Spread], path: Path, batch: int) -> Path:
    """Test rsum (mean ± std over seeds) vs memory size, one line per loss; the in-batch level as a dotted line
    and the mined arm as a star at its own place right of the memory sizes, both in the loss's colour."""
    fig, (ax,) = panels(1, 1, width=6.0)
    sizes = sorted({size for (_, mined, size), s in test.items() if not mined and s.n})
    mined_at = len(sizes)
    for kind in LOSSES:
        memory = [
            (sizes.index(size), s) for (k, mined, size), s in test.items() if k == kind and not mined and s.n
        ]
        if not memory:
            continue
        line = ax.errorbar(
            [x for x, _ in memory],
            [s.mean for _, s in memory],
            yerr=[s.std for _, s in memory],
            marker="o",
            capsize=3,
            label=f"{kind}: memory",
        )
        colour = line.lines[0].get_color()
        base = test.get((kind, 0, 0))
        if base and base.n:
            ax.axhline(base.mean, color=colour, linestyle=":", linewidth=1, label=f"{kind}: in-batch")
        for (k, mined, _), s in test.items():
            if k == kind and mined and s.n:
                ax.errorbar(
                    [mined_at],
                    [s.mean],
                    yerr=[s.std],
                    marker="*",
                    markersize=11,
                    capsize=3,
                    linestyle="none",
                    color=colour,
                    label=f"{kind}: mined {mined}",
                )
    ticks = [f"{s}\n({s / batch:g}×)" if s else "0\n(in-batch)" for s in sizes]
    ax.set_xticks(range(mined_at + 1), [*ticks, "mined\n(no memory)"])
    finish(
        ax,
        title=f"test rsum vs negatives beyond the batch (global batch {batch})",
        xlabel="loss memory rows (multiple of the global batch)",
        ylabel="test rsum (mean ± std over seeds)",
    )
    return save(fig, path)


def _verdict(test: dict[tuple[str, int, int], Spread], setup: Setup) -> list[str]:
    """Each arm's test rsum against the same loss with in-batch negatives alone: clearly above, clearly below or
    within two standard errors; the memory sizes left out (larger than the train split)."""
    lines = []
    for (kind, mined, size), s in test.items():
        base = test.get((kind, 0, 0))
        if not (mined or size) or not s.n:
            continue
        name = arm_name(mined, size, setup.base.train.batch_size)
        if base is None or not base.n:
            lines.append(f"{kind} {name}: no in-batch {kind} trial finished to compare against")
            continue
        verdict = (
            "clearly above"
            if clearly_above(s, base)
            else "clearly below"
            if clearly_above(base, s)
            else "within two standard errors"
        )
        lines.append(
            f"{kind} {name}: test rsum {s.cell()} vs in-batch {base.cell()} ({s.mean - base.mean:+.1f}): {verdict}."
        )
    left_out = memory_sizes(setup)[1]
    if left_out:
        batch = setup.base.train.batch_size
        lines.append(
            f"Not run: memory {', '.join(f'{s} ({s // batch}×)' for s in left_out)} (larger than the "
            f"{int(setup.train_rows * setup.base.data.train_fraction)} train rows)."
        )
    return lines


EXPERIMENT = register_experiment(
    Experiment(
        name="negatives-beyond-batch",
        claim="negatives from outside the batch (a memory of past batches, corpus-mined hard negatives) beat "
        "in-batch negatives alone",
        reference="MoCo (He et al. 2020), XBM (Wang et al. 2020), ANCE (Xiong et al. 2021); issue #47",
        task="pairs",
        space="negatives_beyond_batch",
        sweeps=sweeps,
        summarise=summarise,
        quick={"train.epochs": 2, "train.batch_size": 64, **IN_PROCESS},
    )
)
