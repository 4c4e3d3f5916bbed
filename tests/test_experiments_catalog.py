"""raydist.experiments.catalog: the experiments registry finds a module dropped into the package (no list names
it), and an unknown name lists the registered ones."""

from __future__ import annotations

import sys

import pytest

import raydist.experiments
from raydist.experiments.catalog import EXPERIMENTS, experiment_names, get_experiment


def test_a_module_dropped_into_the_package_is_found(tmp_path, monkeypatch):
    """One new file in raydist/experiments/ (here a temporary folder on the package's path, so that the checkout
    is not written; the registry unread, as in a fresh process) is a new experiment."""
    tag = tmp_path.name.replace("-", "_").lower()
    (tmp_path / f"new_{tag}.py").write_text(
        "from raydist.experiments.catalog import register_experiment\n"
        "from raydist.experiments.spec import Experiment\n\n\n"
        "def summarise(records, out, setup):\n    raise NotImplementedError\n\n\n"
        "EXPERIMENT = register_experiment(\n"
        f'    Experiment(name="new-{tag}", claim="c", reference="r", task="pairs", space="s",\n'
        "               sweeps=lambda setup: [], summarise=summarise)\n)\n"
    )
    package = raydist.experiments
    path = [*package.__path__, str(tmp_path)]
    monkeypatch.setattr(package, "__path__", path)  # where the import looks
    monkeypatch.setattr(package.__spec__, "submodule_search_locations", path)  # where discovery lists
    monkeypatch.setattr(EXPERIMENTS, "_discovered", False)
    try:
        assert f"new-{tag}" in experiment_names()
        assert get_experiment(f"new-{tag}").claim == "c"
        assert EXPERIMENTS.module_of(f"new-{tag}") == f"raydist.experiments.new_{tag}"
    finally:
        EXPERIMENTS.unregister(f"new-{tag}")
        sys.modules.pop(f"raydist.experiments.new_{tag}", None)


def test_the_shipped_experiments_are_registered_by_their_modules():
    assert EXPERIMENTS.module_of("gc-variance") == "raydist.experiments.gradclust_variance"
    with pytest.raises(ValueError, match="unknown experiment 'nope'; registered: gather"):
        get_experiment("nope")
