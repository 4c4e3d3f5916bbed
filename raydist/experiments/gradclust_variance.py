"""``gc-variance``: with duplicated train examples, gradient clustering's stratified estimator has a far lower
normalized variance than SGD's; without duplicates the two are about equal (Faghri et al. 2020, "A Study of
Gradient Variance in Deep Learning"; the thesis ch. 4). Trials train plainly with ``gc.measure``: every
``gc.log_every`` steps the variance meter (raydist.gradclust.variance) draws T extra batches of each
estimator and each epoch reports the means ``gvar/sgd_nvar``, ``gvar/gc_nvar`` and the clustering's
distortion. One run covers one dataset (the default ``duplicated``; ``--data no-duplicates`` is its twin
without copies), and the verdict judges the half of the claim that applies to it."""

from __future__ import annotations

import math
from pathlib import Path

from raydist.experiments.catalog import register_experiment
from raydist.experiments.figures import finish, panels, save, spread_line
from raydist.experiments.records import TrialRecord
from raydist.experiments.spec import IN_PROCESS, Experiment, Setup, Summary, Sweep
from raydist.experiments.tables import Spread, clearly_above, markdown_table, spread

SGD, GC = "gvar/sgd_nvar", "gvar/gc_nvar"
DISTORTION = ("gc/distortion", "gvar/gc_distortion")  # at the end of the epoch, else the meter's mean
FAR_LOWER = 0.75  # "far lower": GC/SGD at most this, and SGD clearly above GC over the seeds
ABOUT_EQUAL = 0.2  # "about equal": |GC/SGD − 1| at most this


def sweeps(setup: Setup) -> list[Sweep]:
    """The space file as it is (only the seeds are swept)."""
    return [Sweep()]


def duplicates(data_dir: Path) -> int | None:
    """Copies of each train example, from the dataset's manifest (``source.duplicates`` of the synthetic
    generator; 1 = none); None when the manifest does not say."""
    from raydist.data import load_manifest

    try:
        value = load_manifest(data_dir).source.get("duplicates")
    except Exception:  # noqa: BLE001  (a re-summarised folder whose data is gone: unknown, not an error)
        return None
    return int(value) if isinstance(value, int) and value >= 1 else None


def _at(record: TrialRecord, key: str) -> dict[int, float]:
    return dict(zip(*record.curve(key), strict=False))


def _distortion(record: TrialRecord) -> dict[int, float]:
    return next((d for d in (_at(record, k) for k in DISTORTION) if d), {})


def _late(record: TrialRecord) -> tuple[float, float]:
    """(SGD, GC) normalized variance averaged over the epochs after the first (clusters formed) where both
    were measured; NaN when there are none."""
    sgd, gc = _at(record, SGD), _at(record, GC)
    epochs = [e for e in sorted(set(sgd) & set(gc)) if e > 1]
    if not epochs:
        return math.nan, math.nan
    return sum(sgd[e] for e in epochs) / len(epochs), sum(gc[e] for e in epochs) / len(epochs)


def _cell(s: Spread, digits: int = 3) -> str:
    return s.cell(digits)


def _general(s: Spread) -> str:
    """A cell for values of any magnitude (the distortion): about 3 significant digits, fixed-point."""
    if s.n == 0:
        return "-"
    digits = max(0, 2 - math.floor(math.log10(abs(s.mean)))) if s.mean else 0
    return s.cell(digits)


def summarise(records: list[TrialRecord], out: Path, setup: Setup) -> Summary:
    """Per epoch: SGD and GC normalized variance, their ratio and the GC distortion (mean ± std over seeds);
    the figure of both over training; the verdict on the epochs after the first."""
    done = [r for r in records if r.history]
    epochs = sorted({e for r in done for e in _at(r, SGD)} | {e for r in done for e in _at(r, GC)})
    rows, table = [], []
    for epoch in epochs:
        sgd = spread(_at(r, SGD).get(epoch, math.nan) for r in done)
        gc = spread(_at(r, GC).get(epoch, math.nan) for r in done)
        ratio = spread(
            _at(r, GC).get(epoch, math.nan) / _at(r, SGD).get(epoch, math.nan)
            for r in done
            if _at(r, SGD).get(epoch)
        )
        dist = spread(_distortion(r).get(epoch, math.nan) for r in done)
        rows.append(
            {
                "epoch": epoch,
                "seeds": max(sgd.n, gc.n),
                "sgd_nvar": vars(sgd),
                "gc_nvar": vars(gc),
                "gc_over_sgd": vars(ratio),
                "gc_distortion": vars(dist),
            }
        )
        table.append([epoch, max(sgd.n, gc.n), _cell(sgd), _cell(gc), _cell(ratio, 2), _general(dist)])
    header = [
        "epoch",
        "seeds",
        "SGD normalized variance",
        "GC normalized variance",
        "GC / SGD",
        "GC distortion",
    ]
    copies = duplicates(setup.data_dir)
    figures = {"gc_variance": _plot(done, out / "gc_variance.png", copies)}
    return Summary(rows, markdown_table(header, table), figures, _verdict(done, copies))


def _data_label(copies: int | None) -> str:
    if copies is None:
        return "data with unknown duplicates"
    return f"each train example ×{copies}" if copies > 1 else "no duplicates"


def _plot(done: list[TrialRecord], path: Path, copies: int | None) -> Path:
    """Normalized variance per epoch, SGD vs GC (mean, min–max over seeds); GC/SGD on the right."""
    fig, (left, right) = panels(1, 2)
    epochs = sorted({e for r in done for e in _at(r, SGD)})
    for key, label, marker in ((SGD, "SGD (uniform batches)", "o"), (GC, "GC (stratified batches)", "s")):
        spread_line(
            left, epochs, [[_at(r, key).get(e, math.nan) for r in done] for e in epochs], label, marker=marker
        )
    left.xaxis.get_major_locator().set_params(integer=True)
    finish(
        left,
        title=f"normalized gradient variance ({_data_label(copies)})",
        xlabel="epoch",
        ylabel="normalized variance",
    )
    ratios = [
        [_at(r, GC).get(e, math.nan) / _at(r, SGD)[e] if _at(r, SGD).get(e) else math.nan for r in done]
        for e in epochs
    ]
    spread_line(right, epochs, ratios, "GC / SGD", color="tab:green")
    right.axhline(1.0, color="grey", linestyle=":", label="equal")
    right.axhline(FAR_LOWER, color="tab:red", linestyle=":", label=f"far lower (≤ {FAR_LOWER})")
    right.set_ylim(bottom=0)
    right.xaxis.get_major_locator().set_params(integer=True)
    finish(right, title="GC / SGD normalized variance", xlabel="epoch", ylabel="ratio")
    return save(fig, path)


def _verdict(done: list[TrialRecord], copies: int | None) -> list[str]:
    """The half of the claim that applies to this data (duplicates: far lower; none: about equal), judged on
    each seed's mean over the epochs after the first."""
    late = [_late(r) for r in done]
    sgd, gc = spread(s for s, _ in late), spread(g for _, g in late)
    ratio = spread(g / s for s, g in late if s)
    lines: list[str] = []
    if ratio.n == 0:
        lines.append(
            "Not testable: no trial reported gvar/sgd_nvar and gvar/gc_nvar after its first epoch "
            "(gc.measure off, a loss without per-example terms, or too few steps for gc.log_every)."
        )
    else:
        measured = (
            f"after epoch 1, GC normalized variance {_cell(gc)} vs SGD {_cell(sgd)}, GC/SGD "
            f"{_cell(ratio, 2)} over {ratio.n} seed(s)"
        )
        apart = (
            "SGD clearly above GC"
            if clearly_above(sgd, gc)
            else "GC clearly above SGD"
            if clearly_above(gc, sgd)
            else "within two standard errors"
        )
        if copies is not None and copies > 1:
            held = clearly_above(sgd, gc) and ratio.mean <= FAR_LOWER
            lines.append(
                f"Duplicated data ({_data_label(copies)}): {measured} ({apart}). GC far lower than SGD "
                f"(GC/SGD ≤ {FAR_LOWER} and SGD clearly above): {'held' if held else 'did not hold'}."
            )
            lines.append(
                "The other half (no duplicates: about equal) is `raydist experiment gc-variance "
                "--data no-duplicates`."
            )
        elif copies == 1:
            held = abs(ratio.mean - 1.0) <= ABOUT_EQUAL
            lines.append(
                f"Data without duplicates: {measured} ({apart}). GC about equal to SGD "
                f"(|GC/SGD − 1| ≤ {ABOUT_EQUAL}): {'held' if held else 'did not hold'}."
            )
            lines.append(
                "The other half (duplicates: far lower) is `raydist experiment gc-variance` "
                "(--data duplicated)."
            )
        else:
            lines.append(
                f"{measured} ({apart}). This dataset's manifest does not say whether its train split "
                f"has duplicates, so neither half of the claim is judged: it predicts GC/SGD ≤ "
                f"{FAR_LOWER} with duplicates and about 1 without."
            )
    return lines


EXPERIMENT = register_experiment(
    Experiment(
        name="gc-variance",
        claim="with duplicated examples, gradient clustering's stratified estimator has a far lower normalized "
        "variance than SGD's; without duplicates the two are about equal",
        reference='Faghri et al. 2020, "A Study of Gradient Variance in Deep Learning"; the thesis ch. 4; '
        "raydist.gradclust (README, Gradient clustering); bench/RESULTS.md",
        task="labels",
        space="gc_variance",
        sweeps=sweeps,
        summarise=summarise,
        quick={"train.epochs": 2, **IN_PROCESS},
        data="duplicated",
    )
)
