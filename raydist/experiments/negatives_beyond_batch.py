"""``negatives-beyond-batch``: negatives from outside the step's batch -- a memory of past global batches (MoCo,
He et al. 2020; XBM, Wang et al. 2020: ``loss.memory_size``) or hard negatives mined from the whole train split
(ANCE, Xiong et al. 2021: ``loss.mined_negatives``) -- raise MH's retrieval over in-batch negatives alone, at the
same batch, steps and schedule (issue #47)."""

from __future__ import annotations

import math
from pathlib import Path

from raydist.experiments.catalog import register_experiment
from raydist.experiments.records import TrialRecord
from raydist.experiments.spec import IN_PROCESS, Experiment, Setup, Summary, Sweep
from raydist.experiments.tables import clearly_above, group_by, markdown_table, spread

MEMORY, MINED = "loss.memory_size", "loss.mined_negatives"
MINING = {MINED: 4, "loss.mine_every": 50, "loss.mine_range": [10, 100]}


def sweeps(setup: Setup) -> list[Sweep]:
    """In-batch and the memory sizes (the space file's grid; quick mode: 0 and 256), then the mined arm."""
    memory = {MEMORY: [0, 256]} if setup.quick else {}
    return [
        Sweep(label="memory", grid=memory),
        Sweep(label="mined", overrides=MINING, grid={MEMORY: [0]}),
    ]


def arm(record: TrialRecord) -> str:
    """``in-batch``, ``memory N`` or ``mined K``."""
    if record.config.get(MINED):
        return f"mined {record.config[MINED]}"
    size = record.config.get(MEMORY, 0)
    return f"memory {size}" if size else "in-batch"


def summarise(records: list[TrialRecord], out: Path, setup: Setup) -> Summary:
    """Test R@1 (i2t, t2i) and rsum, best val rsum and wall time per arm (mean ± std over seeds)."""
    groups = group_by([r for r in records if r.history], arm)
    rows, table, test = [], [], {}
    for name, trials in groups.items():
        stats = {k: spread(r.test.get(k, math.nan) for r in trials) for k in ("i2t_r1", "t2i_r1", "rsum")}
        val = spread(r.val("rsum") for r in trials)
        wall = spread(r.last("time_total_s") for r in trials)
        test[name] = stats["rsum"]
        rows.append({"arm": name, "seeds": len(trials), **{f"test_{k}": vars(s) for k, s in stats.items()}})
        table.append([name, *(s.cell() for s in stats.values()), val.cell(), wall.cell(0)])
    header = ["negatives", "test i2t R@1", "test t2i R@1", "test rsum", "best val rsum", "wall s"]
    return Summary(rows, markdown_table(header, table), {}, _verdict(test))


def _verdict(test: dict) -> list[str]:
    """Each arm's test rsum against in-batch negatives alone, and whether it is clearly above (two standard
    errors)."""
    base = test.get("in-batch")
    if base is None or not base.n:
        return ["no in-batch trial finished: nothing to compare against"]
    return [
        f"{name}: test rsum {s.cell()} vs in-batch {base.cell()}: "
        + ("clearly above" if clearly_above(s, base) else "not clearly above")
        + "."
        for name, s in test.items()
        if name != "in-batch" and s.n
    ]


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
        quick={"train.epochs": 2, "loss.warmup_sh_epochs": 1, "train.batch_size": 64, **IN_PROCESS},
    )
)
