"""``mh-vs-sh``: the max of hinges (MH, VSE++) beats the sum of hinges (SH, VSE0) once warmed up, and by
more with more training data (VSE++ Sec. 4); MH from a random start can stall at its collapse value
2·B·α (every query's hardest negative scores like its positive)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

from raydist.experiments.catalog import register_experiment
from raydist.experiments.figures import finish, panels, save, spread_line
from raydist.experiments.records import TrialRecord
from raydist.experiments.spec import IN_PROCESS, Experiment, Setup, Summary, Sweep
from raydist.experiments.tables import clearly_above, group_by, markdown_table, spread
from raydist.losses import mh_collapse_value

FRACTION = "data.train_fraction"
WARMUP = "loss.warmup_sh_epochs"
VARIANTS = ("SH", "MH", "SH→MH")
COLLAPSE_TOLERANCE = 0.01  # an MH epoch whose mean loss is within 1 % of 2·B·α has stalled (as PairsTask)


def sweeps(setup: Setup) -> list[Sweep]:
    """SH (``loss.hardest=false``, no warm-up) and the file's MH sweep (warm-up 0 and > 0); quick mode: all
    data, warm-up 0 or 1."""
    quick = {FRACTION: [1.0]} if setup.quick else {}
    return [
        Sweep(label="sh", overrides={"loss.hardest": False}, grid={**quick, WARMUP: [0]}),
        Sweep(label="mh", grid={**quick, **({WARMUP: [0, 1]} if setup.quick else {})}),
    ]


def variant(record: TrialRecord) -> str:
    """SH, MH (from a random start) or SH→MH (MH after an SH warm-up)."""
    if not record.config["loss.hardest"]:
        return "SH"
    return "SH→MH" if record.config[WARMUP] > 0 else "MH"


def collapse_value(config: dict) -> float:
    """MH's loss when every hardest negative scores like the positive (:func:`mh_collapse_value`: 2·B·α summed,
    α averaged) for a trial's flat config."""
    return mh_collapse_value(config["train.batch_size"], config["loss.margin"], config["loss.reduction"])


def stalled_epochs(record: TrialRecord) -> list[int]:
    """MH-phase epochs whose mean train loss is within ``COLLAPSE_TOLERANCE`` of the collapse value."""
    value = collapse_value(record.config)
    return [
        int(r["epoch"])
        for r in record.history
        if r.get("loss/hardest") == 1 and abs(r["train/loss"] - value) <= COLLAPSE_TOLERANCE * value
    ]


def epoch_ranges(epochs: list[int]) -> str:
    """``[2, 3, 4, 7]`` → ``"2–4, 7"``."""
    runs: list[list[int]] = []
    for e in epochs:
        if runs and e == runs[-1][-1] + 1:
            runs[-1].append(e)
        else:
            runs.append([e])
    return ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def summarise(records: list[TrialRecord], out: Path, setup: Setup) -> Summary:
    """Test R@1 (i2t, t2i) and rsum per fraction and variant; val rsum per epoch; MH collapse epochs."""
    done = [r for r in records if r.history]
    groups = group_by(done, lambda r: (r.config[FRACTION], VARIANTS.index(variant(r))))
    rows, table = [], []
    for (fraction, v), trials in groups.items():
        stats = {k: spread(r.test.get(k, math.nan) for r in trials) for k in ("i2t_r1", "t2i_r1", "rsum")}
        stalls = [(r.config["train.seed"], stalled_epochs(r)) for r in trials]
        stalled = [f"seed {s}: {epoch_ranges(e)}" for s, e in stalls if e]
        rows.append(
            {
                "train_fraction": fraction,
                "variant": VARIANTS[v],
                "seeds": len(trials),
                "best_epoch": [r.best_epoch for r in trials],
                "stalled_epochs": dict(stalls),
                **{f"test_{k}": vars(s) for k, s in stats.items()},
            }
        )
        table.append(
            [
                fraction,
                VARIANTS[v],
                *(s.cell() for s in stats.values()),
                spread(r.val("rsum") for r in trials).cell(),
                "; ".join(stalled) or "-",
            ]
        )
    header = [
        "train fraction",
        "loss",
        "test i2t R@1",
        "test t2i R@1",
        "test rsum",
        "best val rsum",
        "MH epochs at 2·B·α",
    ]
    figures = {
        "mh_vs_sh_val": _plot_curves(groups, out / "mh_vs_sh_val.png", "val/rsum"),
        "mh_vs_sh_loss": _plot_curves(groups, out / "mh_vs_sh_loss.png", "train/loss"),
    }
    return Summary(rows, markdown_table(header, table), figures, _verdict(groups))


def _plot_curves(groups: dict[tuple, list[TrialRecord]], path: Path, key: str) -> Path:
    """``key`` per epoch, one panel per train fraction, one line per variant (mean, min–max over seeds);
    the loss figure also draws the collapse value 2·B·α."""
    fractions = sorted({f for f, _ in groups})
    fig, axes = panels(1, len(fractions))
    for ax, fraction in zip(axes, fractions, strict=False):
        for (f, v), trials in groups.items():
            if f != fraction:
                continue
            epochs = sorted({e for r in trials for e in r.curve(key)[0]})
            samples = [
                [dict(zip(*r.curve(key), strict=False)).get(e, math.nan) for r in trials] for e in epochs
            ]
            spread_line(ax, epochs, samples, VARIANTS[v])
        if key == "train/loss":
            ax.set_yscale("log")
            any_trial = next(t[0] for (f, _), t in groups.items() if f == fraction)
            ax.axhline(
                collapse_value(any_trial.config), color="grey", linestyle=":", label="2·B·α (MH collapse)"
            )
        ax.xaxis.get_major_locator().set_params(integer=True)
        finish(ax, title=f"{key}, train fraction {fraction}", xlabel="epoch", ylabel=key)
    return save(fig, path)


def _verdict(groups: dict[tuple, list[TrialRecord]]) -> list[str]:
    """SH→MH vs SH on test rsum at each fraction, whether the gap grows with data, and MH's collapse."""
    test = {(f, VARIANTS[v]): spread(r.test.get("rsum", math.nan) for r in t) for (f, v), t in groups.items()}
    lines, gaps, wins = [], [], {}
    for f in sorted({f for f, _ in test}):
        sh, warm = test.get((f, "SH")), test.get((f, "SH→MH"))
        if not (sh and warm and sh.n and warm.n):
            continue
        gaps.append(warm.mean - sh.mean)
        wins[f] = clearly_above(warm, sh)
        verdict = (
            "clearly better"
            if wins[f]
            else "clearly worse"
            if clearly_above(sh, warm)
            else "within two standard errors"
        )
        lines.append(f"fraction {f}: SH→MH − SH test rsum = {gaps[-1]:+.1f} ({verdict}).")
    if gaps:
        grows = len(gaps) > 1 and all(b > a for a, b in itertools.pairwise(gaps))
        held = [str(f) for f, win in wins.items() if win]
        lines.append(
            f"MH beats SH once warmed up: {'held' if all(wins.values()) else 'did not hold'} "
            f"(clearly better at {len(held)} of {len(wins)} fractions: {', '.join(held) or 'none'}); "
            f"by more with more data: {'held' if grows else 'did not hold'} "
            f"(gaps {', '.join(f'{g:+.1f}' for g in gaps)})."
        )
    stalled = [
        (f, r.config["train.seed"], stalled_epochs(r))
        for (f, v), t in groups.items()
        if VARIANTS[v] == "MH"
        for r in t
    ]
    if stalled:
        hits = [f"fraction {f} seed {s}" for f, s, e in stalled if e]
        lines.append(
            f"MH from a random start stalled at 2·B·α in {len(hits)} of {len(stalled)} trials"
            + (f" ({', '.join(hits)})" if hits else "")
            + "."
        )
    return lines


EXPERIMENT = register_experiment(
    Experiment(
        name="mh-vs-sh",
        claim="MH beats SH once warmed up, by more with more data",
        reference="Faghri et al., VSE++ (BMVC 2018), Sec. 4.1 and Table 1; loss.hardest, loss.warmup_sh_epochs",
        task="pairs",
        space="mh_vs_sh",
        sweeps=sweeps,
        summarise=summarise,
        quick={"train.epochs": 2, "train.lr_decay_epoch": 100, **IN_PROCESS},
    )
)
