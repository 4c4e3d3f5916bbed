"""One Ray local cluster per test session, environment set before Ray is imported."""

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "1")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "60")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import pytest


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
    return make_synthetic(out, images=400, captions_per_image=5, dim=32, seed=3, val_images=100, test_images=100)


@pytest.fixture(scope="session")
def labels_dataset(tmp_path_factory):
    """A small synthetic labelled dataset (10 classes, 32-d features) shared by the session's tests."""
    from raydist.data.synthetic_labels import make_synthetic_labels

    out = tmp_path_factory.mktemp("data") / "labels"
    return make_synthetic_labels(out, classes=10, train_per_class=60, val_per_class=20, test_per_class=30,
                                 dim=32, overlap=0.2, seed=3)  # fmt: skip
