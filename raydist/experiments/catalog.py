"""The experiments by name: :data:`EXPERIMENTS`, a :class:`raydist.registry.Registry` that imports every module
of this package the first time it is read. An experiment module registers its one ``EXPERIMENT`` with
:func:`register_experiment`, so a new experiment is one module dropped into this package (+ its space
file)."""

from __future__ import annotations

from raydist.experiments.spec import Experiment
from raydist.registry import Registry

EXPERIMENTS: Registry[Experiment] = Registry("experiment", package="raydist.experiments")


def register_experiment(experiment: Experiment) -> Experiment:
    """Register ``experiment`` under its name, as the module that defines its summary; return it."""
    return EXPERIMENTS.register(experiment.name, experiment, module=experiment.summarise.__module__)


def experiment_names() -> list[str]:
    """The registered experiments' names (the shipped ones and a loaded plugin's), sorted."""
    return EXPERIMENTS.names()


def get_experiment(name: str) -> Experiment:
    """The experiment named ``name``."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; registered: {', '.join(experiment_names())}")
    return EXPERIMENTS.get(name)
