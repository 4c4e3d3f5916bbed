"""Sharded gradient clustering on 2 gloo processes vs one process on the union of the shards.

One spawn runs every case: each rank feeds its own rows of the same global batches (7 and 9 rows, to also
exercise unequal shards) and saves its state; the reference runs here on the full batches.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_gradclust_clustering import batch
from test_gradclust_layers import Mixed, sum_loss

from raydist.distributed.reduce import all_reduce_sum
from raydist.gradclust import GradientClustering

WORLD = 2
ROWS, SPLIT, STEPS = 16, 7, 6
RUNS = {
    "online": {"num_clusters": 6, "mode": "online", "decay": 0.5, "update_every": 2, "min_cluster_size": 4.0},
    "batch": {"num_clusters": 3, "mode": "batch", "min_cluster_size": 3.0},
}


def run_clustering(name: str, model: Mixed, rows: slice) -> GradientClustering:
    """STEPS global batches, this process's ``rows`` of each; batch mode updates after every 2 batches."""
    gc = GradientClustering(model, seed=3, **RUNS[name])
    for s in range(STEPS):
        inputs, targets = batch(100 + s, ROWS)
        ids = 1000 * s + torch.arange(ROWS)
        with gc.capture():
            loss = sum_loss(model, tuple(t[rows] for t in inputs), targets[rows])
        loss.backward()
        model.zero_grad(set_to_none=True)
        gc.after_backward(ids[rows])
        if gc.mode == "batch" and s % 2 == 1:
            gc.update()
    return gc


def _worker(rank: int, init_file: str, state: dict, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    model = Mixed()
    model.load_state_dict(state)
    rows = slice(0, SPLIT) if rank == 0 else slice(SPLIT, ROWS)
    results = {name: run_clustering(name, model, rows).state_dict() for name in RUNS}
    results["reduced"] = all_reduce_sum(torch.tensor([rank + 1.0]))
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("gc")
    torch.manual_seed(0)
    model = Mixed()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(str(out / "init"), model.state_dict(), str(out)), nprocs=WORLD, join=True)
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]
    reference = {name: run_clustering(name, model, slice(0, ROWS)).state_dict() for name in RUNS}
    return {"ranks": ranks, "reference": reference}


def test_all_reduce_sum() -> None:
    t = torch.ones(3)
    assert all_reduce_sum(t) is t and t.tolist() == [1.0, 1.0, 1.0]  # no process group: identity


@pytest.mark.slow
@pytest.mark.gloo
def test_spawned_all_reduce_sum(runs: dict) -> None:
    assert [r["reduced"].item() for r in runs["ranks"]] == [3.0, 3.0]


@pytest.mark.slow
@pytest.mark.gloo
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(RUNS))
def test_workers_hold_identical_centres_equal_to_one_process(runs: dict, name: str) -> None:
    r0, r1 = (r[name] for r in runs["ranks"])
    ref = runs["reference"][name]
    assert r0["counters"] == r1["counters"] == ref["counters"]
    assert ref["counters"]["updates"] == 3 and ref["counters"]["reseeds"] > 0  # splits ran in sync
    for layer in ref["centres"]:
        for factor in ("d", "c"):
            assert torch.equal(r0["centres"][layer][factor], r1["centres"][layer][factor])
            torch.testing.assert_close(
                r0["centres"][layer][factor], ref["centres"][layer][factor], rtol=1e-10, atol=1e-12
            )
    for key in ("counts", "distortion"):
        assert torch.equal(r0[key], r1[key])
        torch.testing.assert_close(r0[key], ref[key], rtol=1e-10, atol=1e-12)
    assert r0["objective"] == pytest.approx(ref["objective"], rel=1e-10)
    # each rank keeps its own rows' assignments; together they are the one-process assignments
    union = {}
    for r in (r0, r1):
        union.update(
            zip(r["assignments"]["sample_ids"].tolist(), r["assignments"]["clusters"].tolist(), strict=False)
        )
    want = dict(
        zip(ref["assignments"]["sample_ids"].tolist(), ref["assignments"]["clusters"].tolist(), strict=False)
    )
    assert union == want
    assert len(r0["assignments"]["sample_ids"]) == STEPS * SPLIT
