"""One Ray local cluster per test session, environment set before Ray is imported, and honest `slow` markers.

`slow` marks every test that pays seconds of multi-process start-up: it starts Ray or uses the session's
Ray (`ray_cluster`: Ray Train fits with workers, Tune sweeps, Ray Data pipelines executed in Ray tasks),
runs a `raydist train` subprocess that starts Ray, starts a `ray start` cluster and submits jobs, or spawns a
gloo process group of more than one process. Tests that start Ray of their own instead of using the session's
(`ray start` + jobs, simulated multi-node clusters, the autoscaler, `raydist train` subprocesses with private
Ray instances) are also marked `cluster`: the README's test command (`-m "not cluster"`) leaves them out and
CI runs them as a second step (`.ci/run`). `pytest -m "not slow"`
runs the rest: in-process code, including `train.num_workers=0` runs and single `python -c` subprocesses.
Slow tests that spawn gloo process groups and start no Ray are also marked `gloo` (while they run, `ray.init`
fails them); under pytest-xdist they run beside the Ray tests (`pytest_itemcollected`).

Enforced here, before fixtures are set up: a test without `slow` that requests `ray_cluster` (directly or
through another fixture) fails with a message saying to mark it, and so does a `cluster` test without `slow`.
While an unmarked test and its fixtures run, `ray.init` and torch's `start_processes` (behind
`torch.multiprocessing.spawn` and raydist's `spawn`) fail the test the same way, and `ray.is_initialized()`
answers False, so an unmarked test cannot use a Ray instance that an earlier test started. Subprocesses
are not watched: a test that runs one which starts Ray must be marked by hand."""

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "1")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "60")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

pytest_plugins = ("pytester", "object_store")  # test_markers runs this conftest; object_store: s3_server

RAY_FIXTURES = frozenset({"ray_cluster"})  # fixtures that start (or hand out) the session's Ray


def _mark_it(item: pytest.Item, why: str) -> str:
    return (
        f'{item.nodeid} {why}, so it must be marked slow (`@pytest.mark.slow`) for `pytest -m "not slow"` '
        "to leave it out (tests/conftest.py)"
    )


def _refuse(item: pytest.Item, what: str):
    def refused(*args, **kwargs):
        pytest.fail(_mark_it(item, f"calls {what}"), pytrace=False)

    return refused


@contextmanager
def _no_multiprocess_start(item: pytest.Item, *, spawn: bool = False) -> Iterator[None]:
    """While an unmarked test (or its fixtures) runs: starting Ray or spawning processes fails the test; with
    ``spawn`` (a `gloo` test) only starting Ray does."""
    import ray
    import ray._private.worker
    import torch.multiprocessing

    # the module torch.multiprocessing.spawn, whose name the function torch.multiprocessing.spawn shadows
    spawn_module = sys.modules["torch.multiprocessing.spawn"]
    patches = [
        (ray, "init", _refuse(item, "ray.init (starts Ray)")),
        (ray._private.worker, "init", _refuse(item, "ray.init (starts Ray)")),
        (ray, "is_initialized", lambda: False),
    ]
    if not spawn:
        patches += [
            (
                torch.multiprocessing,
                "start_processes",
                _refuse(item, "torch.multiprocessing.start_processes"),
            ),
            (spawn_module, "start_processes", _refuse(item, "torch.multiprocessing.spawn")),
        ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


@pytest.hookimpl(wrapper=True, trylast=True)  # innermost: the other plugins' setup has run
def pytest_runtest_setup(item: pytest.Item):
    if item.get_closest_marker("gloo") is not None:
        if item.get_closest_marker("slow") is None:
            pytest.fail(_mark_it(item, "is marked gloo (spawns processes)"), pytrace=False)
        ray_fixtures = sorted(RAY_FIXTURES.intersection(getattr(item, "fixturenames", ())))
        if ray_fixtures:
            pytest.fail(
                f"{item.nodeid} is marked gloo but uses Ray ({', '.join(ray_fixtures)})", pytrace=False
            )
        with _no_multiprocess_start(item, spawn=True):
            return (yield)
    if item.get_closest_marker("slow") is not None:
        return (yield)
    if item.get_closest_marker("cluster") is not None:
        pytest.fail(_mark_it(item, "is marked cluster (a `ray start` cluster)"), pytrace=False)
    ray_fixtures = sorted(RAY_FIXTURES.intersection(getattr(item, "fixturenames", ())))
    if ray_fixtures:
        pytest.fail(_mark_it(item, f"uses the session's Ray ({', '.join(ray_fixtures)})"), pytrace=False)
    with _no_multiprocess_start(item):
        return (yield)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item):
    if item.get_closest_marker("gloo") is not None:
        with _no_multiprocess_start(item, spawn=True):
            return (yield)
    if item.get_closest_marker("slow") is not None:
        return (yield)
    with _no_multiprocess_start(item):
        return (yield)


_VISION_LEFT_OUT = pytest.StashKey[tuple[int, str]]()  # (vision tests deselected, why)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Under pytest-xdist (the README's `-n 2`; `--dist loadgroup` in pyproject.toml) the `slow` tests that use Ray
    run on one worker, in collection order, with one session Ray; the other worker runs the rest (in-process tests
    and `gloo` ones), which alone would leave the second of 2 cores idle. Added here, before collection ends,
    because xdist reads the group when it names the items."""
    if item.get_closest_marker("slow") is not None and item.get_closest_marker("gloo") is None:
        item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.hookimpl(trylast=True)  # after `-m` and `-k` deselected theirs: count only what would have run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``vision`` run on a real torchvision and timm (the ``vision`` extra); where either does not
    import they are deselected (not skipped), and the terminal summary says how many and why."""
    from raydist.models.image_encoders import import_problem

    vision = [item for item in items if item.get_closest_marker("vision") is not None]
    why = (import_problem("torchvision.models") or import_problem("timm")) if vision else None
    if why is None:
        return
    config.hook.pytest_deselected(items=vision)
    items[:] = [item for item in items if item.get_closest_marker("vision") is None]
    config.stash[_VISION_LEFT_OUT] = (len(vision), why)
    if hasattr(config, "workeroutput"):  # an xdist worker: the controller, which collects nothing, prints it
        config.workeroutput["vision_left_out"] = [len(vision), why]


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's controller: a worker's collection ended
def pytest_testnodedown(node, error) -> None:
    left_out = getattr(node, "workeroutput", {}).get("vision_left_out")
    if left_out is not None:
        node.config.stash[_VISION_LEFT_OUT] = tuple(left_out)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    left_out = config.stash.get(_VISION_LEFT_OUT, None)
    if left_out is not None:
        count, why = left_out
        terminalreporter.write_line(
            f"{count} `vision` tests left out: the vision extra (torchvision, timm) cannot be imported here "
            f"({why.splitlines()[0][:200]}). They run where it can (README, Tests: a venv of their own)"
        )


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray instance with 4 logical CPUs (scheduling tokens) shared by the whole session."""
    import ray

    from raydist.runtime import start_local_ray

    start_local_ray(4, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """A small synthetic image–caption dataset shared by the session's tests."""
    from raydist.data import make_synthetic

    out = tmp_path_factory.mktemp("data") / "tiny"
    return make_synthetic(
        out, images=400, captions_per_image=5, dim=32, seed=3, val_images=100, test_images=100
    )


@pytest.fixture(scope="session")
def small_pairs(tmp_path_factory):
    """A fifth of ``tiny_dataset`` (400 train rows: 12 steps of the tiny preset's global batch of 32), for tests
    whose claim holds on any data and whose cost grows with the rows (per-row gradients, whole in-process runs)."""
    from raydist.data import make_synthetic

    out = tmp_path_factory.mktemp("data") / "small-pairs"
    return make_synthetic(out, images=80, captions_per_image=5, dim=32, seed=3, val_images=24, test_images=24)


@pytest.fixture(scope="session")
def labels_dataset(tmp_path_factory):
    """A small synthetic labelled dataset (10 classes, 32-d features) shared by the session's tests."""
    from raydist.data.synthetic_labels import make_synthetic_labels

    out = tmp_path_factory.mktemp("data") / "labels"
    return make_synthetic_labels(
        out, classes=10, train_per_class=60, val_per_class=20, test_per_class=30, dim=32, overlap=0.2, seed=3
    )


@pytest.fixture
def fresh_checkpoint():
    """``make(folder, data_dir, seed=0, **overrides)``: a checkpoint folder of an untrained ``tiny`` model of the
    dataset (random weights give non-trivial metrics and searches; no training needed)."""
    import torch

    from raydist.checkpoint import save_checkpoint
    from raydist.config import load_config
    from raydist.tasks import DataInfo, build_task

    def make(folder, data_dir, seed: int = 0, **overrides):
        overrides = {"data.path": str(data_dir), "train.num_workers": 0, **overrides}
        cfg = load_config("tiny", overrides=overrides)
        info = DataInfo.from_dataset(data_dir)
        torch.manual_seed(seed)
        model = build_task(cfg, info).build_model()
        return save_checkpoint(
            folder, {"model": model.state_dict()}, cfg, task=info.to_json(), files=info.files
        )

    return make
