"""GradientClustering checkpoint state: saved mid-window and restored into a fresh object (through
torch.save/torch.load), the clustering continues exactly as the uninterrupted one.
"""

from __future__ import annotations

import io

import pytest
import torch
from test_gradclust_clustering import batch, step
from test_gradclust_layers import Mixed

from raydist.gradclust import GradientClustering

RUNS = {
    "online": {"num_clusters": 8, "mode": "online", "decay": 0.7, "update_every": 3, "min_cluster_size": 4.0},
    "batch": {"num_clusters": 8, "mode": "batch", "min_cluster_size": 4.0},
}


def advance(gc: GradientClustering, model: Mixed, steps: range) -> list[torch.Tensor]:
    """Batches ``steps`` (ids 100·s + row); batch mode updates after every third batch."""
    out = []
    for s in steps:
        inputs, targets = batch(200 + s)
        out.append(step(gc, model, inputs, targets, ids=100 * s + torch.arange(targets.shape[0])))
        if gc.mode == "batch" and s % 3 == 2:
            gc.update()
    return out


def assert_same_state(got: object, want: object) -> None:
    if isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            assert_same_state(got[key], want[key])
    elif isinstance(want, torch.Tensor):
        assert torch.equal(got, want)
    else:
        assert got == want


@pytest.mark.parametrize("name", list(RUNS))
def test_round_trip_continues_with_identical_clusters(name: str) -> None:
    torch.manual_seed(0)
    model = Mixed()
    uninterrupted = GradientClustering(model, seed=9, **RUNS[name])
    advance(uninterrupted, model, range(5))  # stops inside a window
    saved_at = uninterrupted.state_dict()
    buffer = io.BytesIO()
    torch.save(saved_at, buffer)
    buffer.seek(0)
    resumed = GradientClustering(model, seed=123, **RUNS[name])  # its own seed is overridden by the state
    resumed.load_state_dict(torch.load(buffer))
    assert_same_state(resumed.state_dict(), saved_at)
    want = advance(uninterrupted, model, range(5, 14))
    got = advance(resumed, model, range(5, 14))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=False))
    assert_same_state(resumed.state_dict(), uninterrupted.state_dict())
    assert uninterrupted.reseeds > saved_at["counters"]["reseeds"]  # the restored generator was used
    # without the state the clustering goes elsewhere: the comparison above has teeth
    fresh = GradientClustering(model, seed=9, **RUNS[name])
    advance(fresh, model, range(5, 14))
    assert not torch.equal(fresh.counts, uninterrupted.counts)


def test_incompatible_state_is_refused() -> None:
    model = Mixed()
    gc = GradientClustering(model, 3)
    with pytest.raises(ValueError, match="checkpoint"):
        GradientClustering(model, 4).load_state_dict(gc.state_dict())
    with pytest.raises(ValueError, match="checkpoint"):
        GradientClustering(model, 3, mode="batch").load_state_dict(gc.state_dict())
