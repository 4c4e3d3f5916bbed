"""A Tune sweep on Ray's autoscaler, simulated on this machine from cluster.local.yaml (raydist.autoscaling:
the fake multi-node provider starts and stops "nodes", each its own raylet): the sweep needs more than the
head, so a node is added for it; that node is preempted (killed) after the trial's first checkpoint; the trial
resumes from that checkpoint on a node added in its place, the sweep completes, and every node added is removed
once idle. Also: the YAML validates against the installed Ray's cluster schema, and its head type is the one the
fake provider requires.

The drill runs in a `python -m raydist.autoscaling` subprocess (its own session, killed as a group if it outlives
its timeout), so the session's in-process Ray is never touched, and it stops every process of its cluster."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from drills import run_drill

from raydist.data import load_manifest

REPO = Path(__file__).resolve().parents[1]
LOCAL_YAML = REPO / "cluster.local.yaml"
BATCH, CHECKPOINT_EVERY, EPOCHS = 100, 8, 2  # 20 steps per epoch of the session's tiny dataset (2,000 pairs)
IDLE_S = 5  # the drill's idle timeout (the YAML's is 30 s)


def test_the_local_cluster_yaml_is_valid_and_shaped_like_cluster_yaml():
    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_TYPE
    from ray.autoscaler._private.util import prepare_config, validate_config

    local = yaml.safe_load(LOCAL_YAML.read_text())
    validate_config(prepare_config(copy.deepcopy(local)))
    assert (
        local["head_node_type"] == FAKE_HEAD_NODE_TYPE
    )  # the fake provider knows its head by this name only
    cloud = yaml.safe_load((REPO / "cluster.yaml").read_text())
    workers = {name for name in local["available_node_types"] if name != local["head_node_type"]}
    assert workers == {name for name in cloud["available_node_types"] if name != cloud["head_node_type"]}
    for name in workers:  # logical CPUs stand in for the GPUs; no GPU is asked for
        assert "GPU" not in local["available_node_types"][name]["resources"]
        assert local["available_node_types"][name]["min_workers"] == 0
    assert local["provider"]["use_node_id_as_ip"] and local["provider"]["disable_node_updaters"]


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_sweep_on_the_autoscaler_gets_nodes_survives_a_preemption_and_gives_the_nodes_back(
    tiny_dataset, tmp_path
):
    runs = tmp_path / "runs"
    report = tmp_path / "drill.json"
    sweep = [
        "tune",
        "margin",
        "--preset",
        "tiny",
        "--data",
        str(tiny_dataset),
        "--num-samples",
        "1",
        "--storage",
        str(runs),
        "--storage-shared",
        "train.num_workers=1",
        "train.cpus_per_worker=1",
        f"train.epochs={EPOCHS}",
        f"train.batch_size={BATCH}",
        f"train.checkpoint_every={CHECKPOINT_EVERY}",
        "train.log_every=1",
        "train.min_steps=0",
        "train.max_failures=2",
    ]
    result = run_drill(
        "raydist.autoscaling",
        "--config",
        str(LOCAL_YAML),
        "--preempt-in",
        str(runs),
        "--idle-timeout-s",
        str(IDLE_S),
        "--timeout",
        "420",
        "--",
        *sweep,
        report=report,
        timeout=500,
    )
    text = result["text"]
    assert result["returncode"] == 0, text[-4000:]

    # the head (1 CPU) could not host the trial: the autoscaler added a worker node before it ran, and one more
    # after the preemption; the run's own check said it was waiting for them
    assert "waiting for its autoscaler to add nodes" in text
    assert result["preempted_node"] is not None and result["checkpoint_step"] >= CHECKPOINT_EVERY
    added = [kind for kind, n in result["added"] for _ in range(n)]
    assert len(added) >= 2 and set(added) <= {"ray.worker.a10g", "ray.worker.a100x8"}, result["added"]

    # the trial resumed from a checkpoint at or after the one registered before the preemption, finished every
    # epoch, and no step before that checkpoint was run twice
    assert re.search(r"^== sweep results ==$", text, re.MULTILINE)
    row = next(line for line in text.splitlines() if line.startswith("trial_") and "TERMINATED" in line)
    assert re.search(rf"\s{EPOCHS}\s+TERMINATED\s+all epochs", row), text[-3000:]
    run_dir = next(runs.glob("tune-margin-*/trial_*/train"))
    # the trial's own lines are in the sweep's raydist.log (a sweep's console shows one line per trial event)
    log = "\n".join(p.read_text() for p in runs.glob("tune-margin-*/raydist.log"))
    resumed = [int(m.group(1)) for m in re.finditer(r"resumed from \S+ at epoch \d+, step (\d+)", log)]
    assert resumed and min(resumed) >= result["checkpoint_step"], text[-3000:]
    lines = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    steps = [line["step"] for line in lines]
    per_epoch = load_manifest(tiny_dataset).splits["train"].rows // BATCH
    assert sorted(set(steps)) == list(range(1, EPOCHS * per_epoch + 1))  # every step, to the last
    assert all(steps.count(s) == 1 for s in range(1, result["checkpoint_step"] + 1))  # none redone before it
    # a step run again after the resume starts from the checkpoint's model, optimiser and data position, so it
    # computes the loss it computed before the preemption
    losses: dict[int, list[float]] = {}
    for line in lines:
        losses.setdefault(line["step"], []).append(line["loss"])
    for step, seen in losses.items():
        assert seen == pytest.approx([seen[0]] * len(seen), rel=1e-6), (step, seen)

    # every node the autoscaler added was removed again once idle, within the idle timeout and a few updates
    assert result["all_removed_s"] is not None and result["all_removed_s"] < IDLE_S + 60, result
    assert sum(n for _, n, _ in result["removed"]) == len(added)
