"""``negatives-beyond-batch``: negatives from outside the step's batch -- a memory of past global batches (MoCo,
He et al. 2020; XBM, Wang et al. 2020: ``loss.memory_size``) or hard negatives mined from the whole train split
(ANCE, Xiong et al. 2021: ``loss.mined_negatives``) -- raise MH's retrieval over in-batch negatives alone, at the
same batch, steps and schedule (issue #47); for the ranking loss (MH) and for InfoNCE, whose memory is MoCo's."""

from __future__ import annotations

import math
from pathlib import Path

from raydist.experiments.catalog import register_experiment
from raydist.experiments.records import TrialRecord
from raydist.experiments.spec import IN_PROCESS, Experiment, Setup, Summary, Sweep
from raydist.experiments.tables import clearly_above, group_by, markdown_table, spread

MEMORY, MINED, KIND = "loss.memory_size", "loss.mined_negatives", "loss.kind"
MINING = {MINED: 4, "loss.mine_every": 50, "loss.mine_range": [10, 100]}
INFONCE = {KIND: "infonce"}


def sweeps(setup: Setup) -> list[Sweep]:
    """Per loss (ranking, InfoNCE): in-batch and the memory sizes (the space file's grid; quick mode: 0 and 256),
    then the mined arm."""
    memory = {MEMORY: [0, 256]} if setup.quick else {}
    return [
        Sweep(label="memory", grid=memory),
        Sweep(label="mined", overrides=MINING, grid={MEMORY: [0]}),
        Sweep(label="infonce-memory", overrides=INFONCE, grid=memory),
        Sweep(label="infonce-mined", overrides={**INFONCE, **MINING}, grid={MEMORY: [0]}),
    ]


def arm(record: TrialRecord) -> tuple[str, str]:
    """(the loss kind, ``in-batch`` / ``memory N`` / ``mined K``)."""
    kind = record.config.get(KIND, "auto")
    kind = "ranking" if kind == "auto" else kind
    if record.config.get(MINED):
        return kind, f"mined {record.config[MINED]}"
    size = record.config.get(MEMORY, 0)
    return kind, f"memory {size}" if size else "in-batch"


def summarise(records: list[TrialRecord], out: Path, setup: Setup) -> Summary:
    """Test R@1 (i2t, t2i) and rsum, best val rsum and wall time per arm (mean ± std over seeds)."""
    groups = group_by([r for r in records if r.history], arm)
    rows, table, test = [], [], {}
    for name, trials in groups.items():
        stats = {k: spread(r.test.get(k, math.nan) for r in trials) for k in ("i2t_r1", "t2i_r1", "rsum")}
        val = spread(r.val("rsum") for r in trials)
        wall = spread(r.last("time_total_s") for r in trials)
        test[name] = stats["rsum"]
        rows.append(
            {
                "loss": name[0],
                "arm": name[1],
                "seeds": len(trials),
                **{f"test_{k}": vars(s) for k, s in stats.items()},
            }
        )
        table.append([*name, *(s.cell() for s in stats.values()), val.cell(), wall.cell(0)])
    header = ["loss", "negatives", "test i2t R@1", "test t2i R@1", "test rsum", "best val rsum", "wall s"]
    return Summary(rows, markdown_table(header, table), {}, _verdict(test))


def _verdict(test: dict) -> list[str]:
    """Each arm's test rsum against the same loss with in-batch negatives alone, and whether it is clearly above
    (two standard errors)."""
    lines = []
    for (kind, name), s in test.items():
        base = test.get((kind, "in-batch"))
        if name == "in-batch" or not s.n:
            continue
        if base is None or not base.n:
            lines.append(f"{kind} {name}: no in-batch {kind} trial finished to compare against")
            continue
        verdict = "clearly above" if clearly_above(s, base) else "not clearly above"
        lines.append(f"{kind} {name}: test rsum {s.cell()} vs in-batch {base.cell()}: {verdict}.")
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
