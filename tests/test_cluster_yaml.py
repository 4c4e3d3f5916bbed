"""cluster.yaml validates offline against the cluster-launcher schema shipped in the installed Ray
(no cloud SDK, no credentials), and the same check rejects broken copies of it."""

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

CLUSTER_YAML = Path(__file__).resolve().parents[1] / "cluster.yaml"


@pytest.fixture(scope="module")
def cluster() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def check(config: dict) -> dict:
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def test_cluster_yaml_is_valid(cluster):
    prepared = check(cluster)
    types = prepared["available_node_types"]
    head = types[prepared["head_node_type"]]
    assert "GPU" not in head["resources"]
    gpu_types = {name: t for name, t in types.items() if t["resources"].get("GPU", 0) >= 1}
    assert {t["node_config"]["InstanceType"] for t in gpu_types.values()} == {"g5.xlarge", "p4d.24xlarge"}
    assert all(t["max_workers"] >= t["min_workers"] for t in gpu_types.values())
    assert any('pip install -e ".[gpu]"' in c for c in prepared["worker_setup_commands"])
    assert any(src == "." for src in prepared["file_mounts"].values())  # the repo itself


def _typo_key(c: dict) -> None:
    c["max_worker"] = c.pop("max_workers")


def _fractional_gpu(c: dict) -> None:
    c["available_node_types"]["ray.worker.a10g"]["resources"]["GPU"] = 0.5


def _unknown_head_type(c: dict) -> None:
    c["head_node_type"] = "ray.head.gpu"


def _missing_node_config(c: dict) -> None:
    del c["available_node_types"]["ray.worker.a100x8"]["node_config"]


def _min_above_max_workers(c: dict) -> None:
    c["available_node_types"]["ray.worker.a10g"]["min_workers"] = 11


@pytest.mark.parametrize(
    "break_it, error",
    [
        (_typo_key, jsonschema.ValidationError),
        (_fractional_gpu, jsonschema.ValidationError),
        (_unknown_head_type, ValueError),
        (_missing_node_config, jsonschema.ValidationError),
        (_min_above_max_workers, ValueError),
    ],
)
def test_broken_copies_fail(cluster, break_it, error):
    broken = copy.deepcopy(cluster)
    break_it(broken)
    with pytest.raises(error):
        check(broken)
