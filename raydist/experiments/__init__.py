"""raydist.experiments: papers' headline claims as one-command experiments on the Tune machinery. Each
experiment is one or more space files in ``tune_spaces/`` plus a summary (markdown table, PNG figures,
whether the claim held); :func:`run_experiment` runs one by name and :func:`summarise_saved` re-renders a
finished one.

Shipped (one module each, registered in :data:`raydist.experiments.catalog.EXPERIMENTS`): ``negatives``,
``mh-vs-sh``, ``gather``, ``label-noise``, ``matryoshka``, ``gc-variance`` (gradient clustering's variance). To
add one: write ``raydist/experiments/<name>.py`` with a space file, ``sweeps(setup)``, ``summarise(records, out,
setup)`` and ``EXPERIMENT = register_experiment(Experiment(...))``; the catalogue finds the module. Modules of
this package import each other by their full module names, never through this package.
"""

from raydist.experiments.catalog import experiment_names, get_experiment, register_experiment
from raydist.experiments.runner import run_experiment, summarise_saved
from raydist.experiments.spec import Experiment, Setup, Summary, Sweep

__all__ = [
    "Experiment",
    "Setup",
    "Summary",
    "Sweep",
    "experiment_names",
    "get_experiment",
    "register_experiment",
    "run_experiment",
    "summarise_saved",
]
