"""The shipped experiments by name: imports each experiment module (each defines one ``EXPERIMENT``) and
builds the name → :class:`~raydist.experiments.spec.Experiment` mapping the runner and the CLI look up."""

from __future__ import annotations

from raydist.experiments.gather import EXPERIMENT as GATHER
from raydist.experiments.gradclust_variance import EXPERIMENT as GC_VARIANCE
from raydist.experiments.label_noise import EXPERIMENT as LABEL_NOISE
from raydist.experiments.matryoshka import EXPERIMENT as MATRYOSHKA
from raydist.experiments.mh_vs_sh import EXPERIMENT as MH_VS_SH
from raydist.experiments.negatives import EXPERIMENT as NEGATIVES
from raydist.experiments.spec import Experiment

EXPERIMENTS: dict[str, Experiment] = {
    e.name: e for e in (NEGATIVES, MH_VS_SH, GATHER, LABEL_NOISE, MATRYOSHKA, GC_VARIANCE)
}


def experiment_names() -> list[str]:
    """The shipped experiments' names, sorted."""
    return sorted(EXPERIMENTS)


def get_experiment(name: str) -> Experiment:
    """The experiment named ``name``."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; registered: {', '.join(experiment_names())}")
    return EXPERIMENTS[name]
