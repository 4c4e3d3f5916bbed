"""raydist.experiments: papers' headline claims as one-command experiments on the Tune machinery. Each
experiment is one or more space files in ``tune_spaces/`` plus a summary (markdown table, PNG figures,
whether the claim held); :func:`run_experiment` runs one by name and :func:`summarise_saved` re-renders a
finished one.

Registered here (one module each): ``negatives``, ``mh-vs-sh``, ``gather``, ``label-noise``,
``matryoshka``, ``gc-variance``. To add one: write
``raydist/experiments/<name>.py`` with a space file, ``sweeps(setup)``, ``summarise(records, out, setup)``
and ``register_experiment(Experiment(...))``, and import it below.
"""

from raydist.experiments import gather, gc_variance, label_noise, matryoshka, mh_vs_sh, negatives  # noqa: F401  (register)
from raydist.experiments.registry import Experiment, Setup, Summary, Sweep, experiment_names, get_experiment
from raydist.experiments.runner import run_experiment, summarise_saved

__all__ = [
    "Experiment",
    "Setup",
    "Summary",
    "Sweep",
    "experiment_names",
    "get_experiment",
    "run_experiment",
    "summarise_saved",
]
