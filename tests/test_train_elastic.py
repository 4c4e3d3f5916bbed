"""Elastic training without a cluster: the config rule for the worker counts an elastic run may take, what
Ray Train is asked for, the exact resume position of an in-memory epoch after a resize, and the message of a
fixed-size run that waited for capacity in vain. The runs on a simulated cluster are in test_multinode.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raydist.config import ConfigError, load_config
from raydist.data.stream import InMemoryBatches
from raydist.distributed import StepPlan
from raydist.runtime import Capacity, check_cluster_fits, check_storage_reachable, run_cpus, v1_autoscaling
from raydist.tasks import DataInfo
from raydist.train.trainer import describe_workers, training_failure, worker_range


def test_a_fixed_run_is_the_default_and_an_elastic_one_asks_ray_for_a_range():
    fixed = load_config("tiny", overrides={"train.num_workers": 3, "train.batch_size": 48})
    assert fixed.train.min_workers is None
    assert worker_range(fixed) == 3 and describe_workers(fixed) == "3 Ray Train workers"
    same = load_config(
        "tiny", overrides={"train.num_workers": 3, "train.min_workers": 3, "train.batch_size": 48}
    )
    assert worker_range(same) == 3  # min = max is a fixed-size run
    elastic = load_config(
        "tiny", overrides={"train.num_workers": 3, "train.min_workers": 1, "train.batch_size": 48}
    )
    assert worker_range(elastic) == (1, 3) and describe_workers(elastic) == "1–3 Ray Train workers (elastic)"
    # the up-front CPU check counts the fewest workers the run may start with
    cpus = elastic.train.cpus_per_worker
    assert run_cpus(elastic, fewest=True) == pytest.approx(cpus + 1)
    assert run_cpus(elastic) == pytest.approx(3 * cpus + 1)


@pytest.mark.parametrize(
    "overrides, match",
    [
        # 128 splits over 1, 2 and 4 workers but not over 3: an elastic run may get 3
        (
            {"train.num_workers": 4, "train.min_workers": 1, "train.batch_size": 128},
            r"every worker count .*train.min_workers=1 … train.num_workers=4.*multiple of 12 \(e\.g\. 120 or 132\)",
        ),
        ({"train.num_workers": 2, "train.min_workers": 3}, r"train.min_workers=3 must be between 1 and"),
        ({"train.num_workers": 0, "train.min_workers": 1}, r"an elastic run needs Ray Train workers"),
        (
            {
                "train.num_workers": 3,
                "train.min_workers": 2,
                "train.batch_size": 48,
                "loss.negative_set_size": 100,
            },
            r"negative_set_size=100 > batch size must divide evenly over every worker count from",
        ),
    ],
)
def test_an_elastic_config_that_some_worker_count_cannot_split_is_refused(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config("tiny", overrides=overrides)


def test_an_elastic_config_that_every_worker_count_splits_is_accepted():
    cfg = load_config(
        "tiny",
        overrides={
            "train.num_workers": 4,
            "train.min_workers": 1,
            "train.batch_size": 120,
            "loss.negative_set_size": 240,
        },
    )
    for world in range(1, 5):  # the step plan of every worker count: the same global rows per step
        plan = StepPlan(cfg.train.batch_size, cfg.loss.negative_set_size, world)
        assert plan.rows_per_worker * world == 240


def test_an_in_memory_epoch_resumed_after_a_resize_sees_every_row_once():
    """Rows of step s are those of an uninterrupted run whatever the worker count; an epoch run by 3 workers up
    to step k and by 2 after it (the loop skips the k steps already done) sees exactly the rows that one worker
    sees in that epoch, none twice."""
    n, rows_per_step, seed, epoch = 1000, 48, 5, 2
    arrays = {"sample_id": np.arange(n) + 10_000}

    def epoch_rows(world: int) -> list[np.ndarray]:
        """Per step, the rows of all ranks (rank-major)."""
        ranks = [
            InMemoryBatches(arrays, rows=rows_per_step // world, rank=r, world=world, seed=seed).epoch(epoch)
            for r in range(world)
        ]
        return [np.concatenate([b["sample_id"] for b in step]) for step in zip(*ranks, strict=False)]

    one, two, three = epoch_rows(1), epoch_rows(2), epoch_rows(3)
    steps = n // rows_per_step
    assert len(one) == len(two) == len(three) == steps
    for s in range(steps):  # the same global rows per step, split differently
        assert sorted(three[s]) == sorted(two[s]) == sorted(one[s])

    k = 7  # the checkpoint of the last step done before the loss
    resized = three[:k] + [step for i, step in enumerate(epoch_rows(2)) if i >= k]
    seen = np.concatenate(resized)
    assert len(seen) == len(set(seen.tolist())) == steps * rows_per_step  # no row twice, none skipped
    assert set(seen.tolist()) == set(np.concatenate(one).tolist())


def test_local_storage_is_refused_on_more_than_one_node_unless_shared_or_remote():
    one, four = Capacity(cpus=4, nodes=1), Capacity(cpus=16, nodes=4)
    check_storage_reachable("/runs", False, one)  # one machine: its local folder is fine
    check_storage_reachable("s3://bucket/runs", False, four)
    check_storage_reachable("gs://bucket/runs", False, four)
    check_storage_reachable("/mnt/nfs/runs", True, four)  # declared: --storage-shared
    with pytest.raises(
        ConfigError,
        match=r"has 2 nodes, but the run folder /runs is on a local path.*--storage "
        r"s3://.*--storage-shared \(train.storage_shared=true\)",
    ):
        check_storage_reachable("/runs", False, Capacity(cpus=8, nodes=2))
    # one node up now, but an autoscaler will add more: refused the same way, before any node joins
    for bound in (math.inf, 12.0):
        with pytest.raises(
            ConfigError, match=r"adds nodes as it needs them \(autoscaling\), but the run folder"
        ):
            check_storage_reachable("/runs", False, Capacity(cpus=1, nodes=1, max_cpus=bound))
    check_storage_reachable("/runs", True, Capacity(cpus=1, nodes=1, max_cpus=math.inf))


def test_a_run_beyond_the_cluster_is_refused_unless_an_autoscaler_may_bring_the_cpus(capsys):
    """Without an autoscaler the CPUs up now are all there will be; with one, a run beyond them waits for nodes
    (and says so) unless it is beyond the autoscaler's published bound too."""
    check_cluster_fits(3, Capacity(cpus=3, nodes=1))  # fits exactly: nothing said
    assert capsys.readouterr().out == ""
    with pytest.raises(
        ConfigError, match=r"this run needs 3 logical CPUs .* but the Ray cluster has 2: lower"
    ):
        check_cluster_fits(3, Capacity(cpus=2, nodes=1))
    check_cluster_fits(3, Capacity(cpus=1, nodes=1, max_cpus=math.inf))  # v1 autoscaler: no bound published
    assert "has 1 logical CPUs now and 3 are needed: waiting for its autoscaler" in capsys.readouterr().out
    check_cluster_fits(3, Capacity(cpus=1, nodes=1, max_cpus=9))
    assert "waiting for its autoscaler to add nodes (up to 9)" in capsys.readouterr().out
    with pytest.raises(
        ConfigError, match=r"has 1 and its autoscaler adds nodes up to 2: lower train.num_workers"
    ):
        check_cluster_fits(3, Capacity(cpus=1, nodes=1, max_cpus=2))


def test_the_cli_declares_shared_storage():
    from raydist.cli import config_from_args, parse_args

    args = parse_args(["train", "--preset", "tiny", "--storage", "/mnt/nfs/runs", "--storage-shared"])
    assert config_from_args(args).train.storage_shared is True
    assert config_from_args(parse_args(["train", "--preset", "tiny"])).train.storage_shared is False


class WorkerGroupStartupTimeoutError(Exception):
    """Stands in for Ray's private exception of that name (matched by name)."""


class ControllerError(Exception):
    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.controller_failure = cause


def test_a_fixed_run_that_waited_for_capacity_in_vain_says_so_and_how_to_continue():
    named = load_config(
        "tiny",
        overrides={
            "train.num_workers": 3,
            "train.batch_size": 48,
            "train.run_name": "r1",
            "train.capacity_wait_s": 90,
        },
    )
    error = training_failure(
        ControllerError(WorkerGroupStartupTimeoutError("timed out after 45 s")), named, "/x/r1"
    )
    assert isinstance(error, RuntimeError)
    assert "3 Ray Train workers did not get their CPUs/GPUs within train.capacity_wait_s=90 s" in str(error)
    assert "train.min_workers" in str(error) and "the same command continues it" in str(error)
    unnamed = load_config("tiny", overrides={"train.num_workers": 3, "train.batch_size": 48})
    error = training_failure(ControllerError(WorkerGroupStartupTimeoutError("x")), unnamed, "/x/raydist-1")
    assert "raydist train --resume /x/raydist-1 continues it" in str(error)
    other = training_failure(
        ControllerError(ValueError("boom")), named, "/x/r1"
    )  # anything else: its own line
    assert "boom" in str(other) and "capacity_wait_s" not in str(other)


def test_the_drill_finds_restarts_in_the_progress_lines():
    from raydist.simcluster import progress_steps, restarts

    lines = [
        "[raydist] epoch 1/2 step 4/20 (20%) samples/s 90",
        "[raydist] epoch 1/2 step 5/20 (25%) samples/s 90",
        "(RayTrainWorker) something else",
        "[raydist] epoch 1/2 step 7/20 (35%) samples/s 90",
        "[raydist] resumed from /r/checkpoint_x at epoch 1, step 5",
        "[raydist] epoch 1/2 step 6/20 (30%) samples/s 0",
        "[raydist] epoch 2/2 step 1/20 (5%) samples/s 80",
    ]
    steps = progress_steps(lines, [10.0, 11.0, 11.5, 12.0, 30.0, 31.5, 40.0])
    assert steps == [(10.0, 4), (11.0, 5), (12.0, 7), (31.5, 6), (40.0, 21)]
    # steps 6 and 7 ran twice; 19.5 s between the end of step 7 and the end of the new step 6
    assert restarts(steps) == [{"from_step": 7, "to_step": 6, "redone": 2, "gap_s": 19.5}]


def test_the_v1_monitor_of_a_plain_head_is_not_an_autoscaler():
    """Every Ray head runs the v1 monitor; only one given an autoscaling config names node types of its own
    (shapes as the monitor of Ray 2.60 reports them: a plain `ray start --head`, and cluster.local.yaml's head)."""
    node = "311899588e304cfeafa2597d8a6f3ac2b731d655d934c381b31ac50b"
    plain = {"autoscaler_report": {"node_type_mapping": {node: f"node_{node}"}, "legacy": True}}
    fake_head = "f" * 51 + "00000"
    configured = {"autoscaler_report": {"node_type_mapping": {fake_head: "ray.head.default"}, "legacy": True}}
    assert not v1_autoscaling(plain) and not v1_autoscaling({})
    assert v1_autoscaling(configured)


def test_an_elastic_run_retries_by_default_and_says_so(tiny_dataset):
    from raydist.config import ELASTIC_RETRIES, failure_retries
    from raydist.train.plan import resolve_schedule

    elastic = {"train.num_workers": 2, "train.min_workers": 1, "train.batch_size": 32}
    cfg = load_config("tiny", overrides=elastic)
    assert cfg.train.max_failures is None and failure_retries(cfg.train) == ELASTIC_RETRIES > 0
    _, note = resolve_schedule(cfg, DataInfo.from_dataset(tiny_dataset))
    assert f"elastic: up to {ELASTIC_RETRIES} restarts from the last checkpoint" in note
    told = load_config("tiny", overrides={**elastic, "train.max_failures": 0})
    assert (
        failure_retries(told.train) == 0
        and "restarts" not in resolve_schedule(told, DataInfo.from_dataset(tiny_dataset))[1]
    )
    fixed = load_config("tiny", overrides={"train.num_workers": 2})
    assert (
        failure_retries(fixed.train) == 0
        and "restarts" not in resolve_schedule(fixed, DataInfo.from_dataset(tiny_dataset))[1]
    )


def test_a_run_without_retries_names_the_key_that_would_have_kept_it_going():
    fixed = load_config("tiny", overrides={"train.num_workers": 2})
    lost = ControllerError(RuntimeError("gloo: Connection closed by peer"))
    message = str(training_failure(lost, fixed, "/x/r1"))
    assert "Connection closed by peer" in message and "train.max_failures=3 would have restarted" in message
    assert "train.min_workers" in message
    retried = load_config("tiny", overrides={"train.num_workers": 2, "train.max_failures": 2})
    assert "would have restarted" not in str(training_failure(lost, retried, "/x/r1"))
    in_process = load_config("tiny", overrides={"train.num_workers": 0})
    assert "would have restarted" not in str(training_failure(lost, in_process))
