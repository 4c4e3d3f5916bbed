"""``gather``: cross-worker negatives matter more as workers grow. At a fixed global batch B, W workers
without ``loss.gather`` mine each query's hardest negative from B/W rows instead of B; with it, a share of
about (W−1)/W of the hardest negatives lives on another worker (``train/neg/remote_hardest_frac``)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

from raydist.experiments.catalog import register_experiment
from raydist.experiments.figures import finish, panels, save, spread_line
from raydist.experiments.records import TrialRecord
from raydist.experiments.spec import Experiment, Setup, Summary, Sweep
from raydist.experiments.tables import clearly_above, group_by, markdown_table, spread

WORKERS = (1, 2, 4)
QUICK_WORKERS = (2,)
REMOTE = "train/neg/remote_hardest_frac"


def sweeps(setup: Setup) -> list[Sweep]:
    """The space file once per worker count (``train.num_workers``), same global batch."""
    return [
        Sweep(label=f"w{w}", overrides={"train.num_workers": w})
        for w in (QUICK_WORKERS if setup.quick else WORKERS)
    ]


def summarise(records: list[TrialRecord], out: Path, setup: Setup) -> Summary:
    """Test rsum / R@1 and the last epoch's remote-hardest fraction per (workers, gather)."""
    groups = group_by(
        [r for r in records if r.history], lambda r: (r.config["train.num_workers"], r.config["loss.gather"])
    )
    rows, table = [], []
    for (w, gather), trials in groups.items():
        stats = {k: spread(r.test.get(k, math.nan) for r in trials) for k in ("i2t_r1", "t2i_r1", "rsum")}
        remote = spread(r.last(REMOTE) for r in trials)
        batch = trials[0].config["train.batch_size"]
        rows.append(
            {
                "workers": w,
                "gather": gather,
                "seeds": len(trials),
                "remote_hardest_frac": vars(remote),
                **{f"test_{k}": vars(s) for k, s in stats.items()},
            }
        )
        table.append(
            [
                w,
                "on" if gather else "off",
                batch if gather else batch // w,
                *(s.cell() for s in stats.values()),
                remote.cell(3),
                f"{(w - 1) / w:.3f}" if gather else "0",
            ]
        )
    header = [
        "workers",
        "gather",
        "keys per query",
        "test i2t R@1",
        "test t2i R@1",
        "test rsum",
        "remote hardest (last epoch)",
        "(W−1)/W",
    ]
    figure = _plot(groups, out / "gather.png")
    return Summary(rows, markdown_table(header, table), {"gather": figure}, _verdict(groups))


def _plot(groups: dict[tuple, list[TrialRecord]], path: Path) -> Path:
    fig, (ax_rsum, ax_remote) = panels(1, 2)
    workers = sorted({w for w, _ in groups})
    for gather in (True, False):
        label = "gather on" if gather else "gather off"
        spread_line(
            ax_rsum,
            workers,
            [[r.test.get("rsum", math.nan) for r in groups.get((w, gather), [])] for w in workers],
            label,
        )
        spread_line(
            ax_remote,
            workers,
            [[r.last(REMOTE) for r in groups.get((w, gather), [])] for w in workers],
            label,
        )
    ax_remote.plot(workers, [(w - 1) / w for w in workers], color="grey", linestyle=":", label="(W−1)/W")
    for ax in (ax_rsum, ax_remote):
        ax.set_xticks(workers)
    finish(ax_rsum, title="test rsum vs workers (same global batch)", xlabel="workers W", ylabel="test rsum")
    finish(ax_remote, title="hardest negatives on another worker", xlabel="workers W", ylabel="fraction")
    return save(fig, path)


def _verdict(groups: dict[tuple, list[TrialRecord]]) -> list[str]:
    """Gap (on − off) in test rsum per worker count, whether it grows with W, and W=1 on = off."""
    test = {k: spread(r.test.get("rsum", math.nan) for r in t) for k, t in groups.items()}
    lines, gaps = [], []
    for w in sorted({w for w, _ in test}):
        on, off = test.get((w, True)), test.get((w, False))
        if not (on and off and on.n and off.n):
            continue
        gaps.append((w, on.mean - off.mean, clearly_above(on, off)))
        lines.append(
            f"W={w}: gather on − off test rsum = {on.mean - off.mean:+.1f}"
            f" ({'clearly better' if gaps[-1][2] else 'within two standard errors or worse'})."
        )
    if len(gaps) > 1:
        grows = all(b[1] > a[1] for a, b in itertools.pairwise(gaps))
        matters = gaps[-1][2]
        lines.append(
            f"Cross-worker negatives matter as workers grow: "
            f"{'held' if grows and matters else 'did not hold'} (gap grows with W: {grows}; "
            f"clear at W={gaps[-1][0]}: {matters})."
        )
    alone = {
        g: sorted((r.config["train.seed"], r.test.get("rsum")) for r in groups.get((1, g), []))
        for g in (True, False)
    }
    if alone[True] and alone[False]:
        same = alone[True] == alone[False]
        lines.append(
            f"W=1 (no other worker): gather on and off {'give identical' if same else 'differ in'} "
            "test rsum per seed."
        )
    return lines


EXPERIMENT = register_experiment(
    Experiment(
        name="gather",
        claim="cross-worker negatives matter more as the number of workers grows",
        reference="raydist loss.gather (README 'Cross-worker negatives'); cf. open_clip's gather_features",
        task="pairs",
        space="gather",
        sweeps=sweeps,
        summarise=summarise,
        quick={"train.epochs": 1, "train.batch_size": 64},
    )
)
