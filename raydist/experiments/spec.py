"""What an experiment is: one or more Tune sweeps (space files in ``tune_spaces/``) plus a summary that turns
the finished trials into a table and figures (:class:`Experiment`, :class:`Setup`, :class:`Sweep`,
:class:`Summary`). Ray-free; the experiments are registered in :mod:`raydist.experiments.catalog`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raydist.config import Config
from raydist.experiments.records import TrialRecord


@dataclass(frozen=True)
class Setup:
    """What an experiment's sweeps depend on: quick or normal mode, the seeds, the dataset and its size, and
    ``base``, the resolved config of the experiment's space file (preset ← file ← quick/user overrides)."""

    quick: bool
    seeds: tuple[int, ...]
    data_dir: Path
    train_rows: int
    num_classes: int | None
    base: Config


@dataclass(frozen=True)
class Sweep:
    """One Tune sweep: the space file ``tune_spaces/<space>.yaml`` (None: the experiment's) with some ``grid``
    entries replaced (``train.seed`` always gets the run's seeds) and ``overrides`` that every trial of this
    sweep shares (applied last). ``label`` names it among the experiment's sweeps."""

    label: str = ""
    space: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    grid: Mapping[str, list[Any]] = field(default_factory=dict)


@dataclass
class Summary:
    """What a summary function returns: table rows, the markdown table(s), figure paths and one line per
    part of the claim saying whether it held on this data."""

    rows: list[dict[str, Any]]
    table: str
    figures: dict[str, Path]
    verdict: list[str]


# Quick mode of an experiment whose trials train one worker each: the trials train in their Tune actors
# (bit for bit a one-worker Ray Train run's loop, tests/test_train_faults.py) without starting a worker group each.
IN_PROCESS = {"train.num_workers": 0}


@dataclass(frozen=True)
class Experiment:
    """A paper's claim as a runnable experiment.

    ``task`` names the data it needs (``pairs`` or ``labels``); ``space`` its space file in ``tune_spaces/``;
    ``sweeps`` lists the Tune sweeps of a run; ``summarise(records, out_dir, setup)`` writes the figures into
    ``out_dir`` and returns a :class:`Summary`. ``seeds`` are the normal mode's seeds (quick mode runs the
    first); ``preset`` is the base preset; ``quick`` the overrides of quick mode (epochs, sizes); ``data`` the
    named dataset used when the run gives no ``--data`` (:data:`raydist.experiments.datasets.DATA_SOURCES`;
    None: the task's default).
    """

    name: str
    claim: str
    reference: str
    task: str
    space: str
    sweeps: Callable[[Setup], list[Sweep]]
    summarise: Callable[[list[TrialRecord], Path, Setup], Summary]
    seeds: tuple[int, ...] = (0, 1, 2)
    preset: str = "tiny"
    quick: Mapping[str, Any] = field(default_factory=dict)
    data: str | None = None
