"""The datasets experiments and benchmarks run on: a folder given by the user, or a named source generated
into the run's output folder (:data:`DATA_SOURCES`): synthetic image–caption pairs, the real digit halves
(:mod:`raydist.experiments.digit_halves`), synthetic labelled vectors, or scikit-learn's bundled digits
(1797 8×8 images, 10 classes) converted with :func:`raydist.converters.npz.convert_npz`."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raydist.config import ConfigError
from raydist.data import ensure_default_dataset, load_manifest
from raydist.data.schema import MANIFEST_NAME

# Quick mode: seconds-long trials. Normal mode on pairs uses the embedded default dataset (3000 train
# images × 5 captions, 500 val and 1000 test images; the one README and bench/RESULTS.md report on).
QUICK_PAIRS = {
    "images": 160,
    "captions_per_image": 5,
    "dim": 32,
    "val_images": 40,
    "test_images": 40,
    "seed": 0,
}
QUICK_LABELS = {
    "classes": 5,
    "train_per_class": 40,
    "val_per_class": 10,
    "test_per_class": 10,
    "dim": 16,
    "overlap": 0.3,
    "seed": 0,
}
LABELS = {
    "classes": 10,
    "train_per_class": 100,
    "val_per_class": 40,
    "test_per_class": 60,
    "dim": 32,
    "overlap": 0.3,
    "seed": 0,
}
# Gradient clustering's variance study (gc-variance, bench/RESULTS.md): 40 distinct train examples × 16 copies
# (identical features and label), and its twin without duplicates (64 distinct examples per class); both are
# small enough for quick mode as they are.
DUPLICATED = {
    "classes": 10,
    "train_per_class": 4,
    "duplicates": 16,
    "val_per_class": 20,
    "test_per_class": 20,
    "dim": 32,
    "overlap": 0.05,
    "seed": 5,
}
NO_DUPLICATES = {**DUPLICATED, "train_per_class": 64, "duplicates": 1}


def experiment_dataset(task: str, data: str | None, folder: Path, *, quick: bool) -> Path:
    """The dataset folder of a run: ``data`` when it is a folder (its manifest must name ``task``), else the
    source of :data:`DATA_SOURCES` named ``data`` (None: :data:`DEFAULT_SOURCES` of the task), which must
    serve ``task``, generated under ``folder`` (quick mode: a tiny one where the source has one)."""
    if data and data not in DATA_SOURCES:
        path = Path(data).expanduser().resolve()
        if not (path / MANIFEST_NAME).is_file():
            named = "".join(f"\n  {n} ({s.task}): {s.description}" for n, s in DATA_SOURCES.items())
            raise ConfigError(
                f"--data {data}: neither a dataset folder (no {MANIFEST_NAME}) nor one of the named "
                f"datasets:{named}"
            )
        found = load_manifest(path).task
        if found != task:
            raise ConfigError(
                f"--data {data}: this experiment needs a {task!r} dataset, the folder holds {found!r}"
            )
        return path
    name = data or DEFAULT_SOURCES.get(task)
    if name is None:
        raise ConfigError(f"no default dataset for task {task!r}")
    source = DATA_SOURCES[name]
    if source.task != task:
        named = ", ".join(n for n, s in DATA_SOURCES.items() if s.task == task)
        raise ConfigError(
            f"--data {name}: a {source.task!r} dataset; this experiment needs a {task!r} one "
            f"(named: {named}, or a folder)"
        )
    return source.build(folder, quick)


def _generated_pairs(folder: Path) -> Path:
    from raydist.data import make_synthetic

    out = folder / "pairs-quick"
    if not (out / MANIFEST_NAME).is_file():
        make_synthetic(out, overwrite=True, **QUICK_PAIRS)
    return out


def _generated_labels(folder: Path, args: dict[str, float]) -> Path:
    from raydist.data.synthetic_labels import make_synthetic_labels

    out = folder / ("labels-" + "-".join(f"{k[0]}{v}" for k, v in args.items()))
    if not (out / MANIFEST_NAME).is_file():
        make_synthetic_labels(out, overwrite=True, **args)
    return out


def digits_dataset(folder: Path, *, seed: int = 0) -> Path:
    """scikit-learn's digits as a task-``labels`` dataset under ``folder``: features scaled to [0, 1]
    (pixel / 16), saved as ``digits.npz`` (X, y) and converted with a stratified split (val 10 %, test 20 %,
    ``seed``). Needs scikit-learn: ``pip install 'raydist[experiments]'``."""
    _require_scikit_learn("digits")
    from sklearn.datasets import load_digits

    from raydist.converters.npz import convert_npz

    out = folder / f"digits-s{seed}"
    if (out / MANIFEST_NAME).is_file():
        return out
    digits = load_digits()
    folder.mkdir(parents=True, exist_ok=True)
    npz = folder / "digits.npz"
    np.savez(npz, X=(digits.data / 16.0).astype(np.float32), y=digits.target.astype(np.int64))
    return convert_npz(npz, out, val_fraction=0.1, test_fraction=0.2, seed=seed, overwrite=True)


def _require_scikit_learn(name: str) -> None:
    if importlib.util.find_spec("sklearn") is None:
        raise ConfigError(
            f"the {name} dataset needs scikit-learn, which is not installed: pip install 'raydist[experiments]' "
            "(or pip install scikit-learn), or pass another --data (a named dataset or a dataset folder)"
        )


def digit_halves_dataset(folder: Path, *, seed: int = 0) -> Path:
    """The digit halves (:mod:`raydist.experiments.digit_halves`, split ``seed``) as a pairs dataset under
    ``folder``. Needs scikit-learn: ``pip install 'raydist[experiments]'``."""
    _require_scikit_learn("digit-halves")
    from raydist.experiments.digit_halves import write_digit_halves

    out = folder / f"digit-halves-s{seed}"
    if (out / MANIFEST_NAME).is_file():
        return out
    return write_digit_halves(out, seed=seed)


@dataclass(frozen=True)
class DataSource:
    """A dataset that runs name (``--data NAME``): the ``task`` it serves, ``build(folder, quick)`` (writes it
    under ``folder`` once and returns its folder) and a line saying what it is."""

    task: str
    build: Callable[[Path, bool], Path]
    description: str


DATA_SOURCES: dict[str, DataSource] = {
    "synthetic-pairs": DataSource(
        "pairs",
        lambda folder, quick: _generated_pairs(folder) if quick else ensure_default_dataset(),
        "the embedded synthetic image-caption set (quick mode: a tiny generated one)",
    ),
    "digit-halves": DataSource(
        "pairs",
        lambda folder, quick: digit_halves_dataset(folder),
        "scikit-learn's digits cut in halves: the left half as features, the right half as pixel words",
    ),
    "synthetic": DataSource(
        "labels",
        lambda folder, quick: _generated_labels(folder, QUICK_LABELS if quick else LABELS),
        "synthetic labelled vectors (quick mode: fewer, smaller)",
    ),
    "digits": DataSource(
        "labels", lambda folder, quick: digits_dataset(folder), "scikit-learn's digits, 10 classes"
    ),
    "duplicated": DataSource(
        "labels",
        lambda folder, quick: _generated_labels(folder, DUPLICATED),
        "40 distinct labelled examples x 16 copies (gc-variance)",
    ),
    "no-duplicates": DataSource(
        "labels",
        lambda folder, quick: _generated_labels(folder, NO_DUPLICATES),
        "the duplicated set's twin without copies (64 distinct examples per class)",
    ),
}
DEFAULT_SOURCES = {"pairs": "synthetic-pairs", "labels": "synthetic"}
