"""The `slow` marker is enforced (tests/conftest.py): run the real conftest on a few small tests, in process
(pytester), and check that unmarked tests that would start Ray or spawn processes fail with a message saying
to mark them, before anything starts, while `slow` tests run unguarded and `-m "not slow"` leaves them out; a
`gloo` test must be slow and may spawn but not start Ray; slow tests but gloo ones form pytest-xdist's Ray group."""

from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")
# the inner runs: no cache files, and no pytest-benchmark (where installed it warns under xdist; as in addopts)
QUIET_PLUGINS = ("-p", "no:cacheprovider", "-p", "no:benchmark")

TESTS = """
import pytest


def test_plain():
    pass


def test_unmarked_requests_ray(ray_cluster):
    pass


@pytest.fixture
def through(ray_cluster):
    return ray_cluster


def test_unmarked_requests_ray_through_a_fixture(through):
    pass


def test_unmarked_starts_ray():
    from raydist.runtime import start_local_ray

    start_local_ray(1)


def test_unmarked_spawns_a_gloo_group():
    from raydist.distributed.spawn import spawn

    spawn(print, (), nprocs=2)


def test_unmarked_torch_spawn():
    import torch.multiprocessing as mp

    mp.spawn(print, nprocs=2)


@pytest.fixture(scope="module")
def spawned():
    import torch.multiprocessing as mp

    mp.spawn(print, nprocs=2)


def test_unmarked_spawns_in_a_module_fixture(spawned):
    pass


def test_unmarked_does_not_see_a_running_ray():
    import ray

    assert ray.is_initialized() is False


@pytest.mark.cluster
def test_cluster_without_slow():
    pass


@pytest.mark.gloo
def test_gloo_without_slow():
    pass


@pytest.mark.slow
@pytest.mark.gloo
def test_gloo_spawns_unguarded():
    import torch.multiprocessing as mp

    assert id(mp.start_processes) == OUTER_SPAWN  # this conftest did not replace it for a gloo test


@pytest.mark.slow
@pytest.mark.gloo
def test_gloo_starts_ray():
    from raydist.runtime import start_local_ray

    start_local_ray(1)


@pytest.mark.slow
def test_slow_runs_unguarded():
    import ray

    assert id(ray.init) == OUTER_INIT  # this conftest did not replace ray.init for a slow test
"""


def test_unmarked_multiprocess_tests_fail_and_slow_ones_are_deselected(pytester: pytest.Pytester) -> None:
    import ray
    import torch.multiprocessing

    pytester.makeconftest(CONFTEST.read_text())
    # ray.init and start_processes as this (unmarked) test sees them: already replaced by the outer conftest's guard
    outer = {"OUTER_INIT": id(ray.init), "OUTER_SPAWN": id(torch.multiprocessing.start_processes)}
    tests = TESTS
    for name, value in outer.items():
        tests = tests.replace(name, str(value))
    pytester.makepyfile(test_guarded=tests)

    result = pytester.runpytest_inprocess(*QUIET_PLUGINS)
    result.assert_outcomes(passed=4, failed=4, errors=5)
    mark_it = "must be marked slow (`@pytest.mark.slow`)"
    for line in (
        "test_guarded.py::test_unmarked_requests_ray uses the session's Ray (ray_cluster), so it " + mark_it,
        "test_guarded.py::test_unmarked_requests_ray_through_a_fixture uses the session's Ray (ray_cluster)*",
        "test_guarded.py::test_cluster_without_slow is marked cluster (a `ray start` cluster)*",
        "test_guarded.py::test_unmarked_starts_ray calls ray.init (starts Ray), so it " + mark_it + "*",
        "test_guarded.py::test_unmarked_spawns_a_gloo_group calls torch.multiprocessing.start_processes*",
        "test_guarded.py::test_unmarked_torch_spawn calls torch.multiprocessing.spawn*",
        "test_guarded.py::test_unmarked_spawns_in_a_module_fixture calls torch.multiprocessing.spawn*",
        "test_guarded.py::test_gloo_without_slow is marked gloo (spawns processes), so it " + mark_it,
        "test_guarded.py::test_gloo_starts_ray calls ray.init (starts Ray), so it " + mark_it,
    ):
        result.stdout.fnmatch_lines(["*" + line.rstrip("*") + "*"])

    selected = pytester.runpytest_inprocess(*QUIET_PLUGINS, "-m", "not slow", "--collect-only")
    selected.stdout.fnmatch_lines(["*10/13 tests collected (3 deselected)*"])
    assert "test_slow_runs_unguarded" not in selected.stdout.str()

    # pytest-xdist's group: the slow tests that may use Ray go to one worker; gloo ones and the rest anywhere
    items, _ = pytester.inline_genitems(*QUIET_PLUGINS)
    grouped = [item.name for item in items if item.get_closest_marker("xdist_group")]
    assert grouped == ["test_slow_runs_unguarded"]
