"""Train batches: the in-memory split (equal, disjoint per-rank batches, reshuffled per epoch), id-based
subsets and per-id random numbers."""

from __future__ import annotations

import numpy as np

from raydist.data.hashing import uniform_by_id
from raydist.data.stream import InMemoryBatches, train_subset


def test_in_memory_batches_split_each_step_over_ranks():
    arrays = {"x": np.arange(103), "y": np.arange(103) * 2}
    ranks = [InMemoryBatches(arrays, rows=5, rank=r, world=2, seed=7) for r in range(2)]
    assert ranks[0].steps_per_epoch() == 103 // 10
    for epoch in (0, 1):
        batches = [list(b.epoch(epoch)) for b in ranks]
        assert [len(b) for b in batches] == [10, 10]
        seen = np.concatenate([step["x"] for rank in batches for step in rank])
        assert len(seen) == 100 and len(np.unique(seen)) == 100  # every row at most once per epoch
        assert all((step["y"] == 2 * step["x"]).all() for rank in batches for step in rank)
    first = [s["x"].tolist() for s in ranks[0].epoch(0)]
    assert first == [s["x"].tolist() for s in ranks[0].epoch(0)]  # deterministic
    assert first != [s["x"].tolist() for s in ranks[0].epoch(1)]  # reshuffled


def test_train_subset_keeps_whole_images_and_the_fraction():
    image_ids = np.repeat(np.arange(2000), 5)
    batch = {"image_id": image_ids, "sample_id": np.arange(10000)}
    kept = train_subset(batch, 0.3, seed=1)
    images = np.unique(kept["image_id"])
    assert abs(len(images) / 2000 - 0.3) < 0.04
    assert len(kept["image_id"]) == 5 * len(images)  # all captions of a kept image
    assert train_subset(batch, 1.0, seed=1) is batch


def test_uniform_by_id_is_uniform_and_a_function_of_id_and_seed():
    ids = np.arange(200_000)
    u = uniform_by_id(ids, seed=3)
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    hist = np.histogram(u, bins=10, range=(0, 1))[0] / len(u)
    assert np.abs(hist - 0.1).max() < 0.005
    assert (uniform_by_id(ids[::-1], seed=3) == u[::-1]).all()
    assert not np.allclose(uniform_by_id(ids, seed=4), u)
    assert abs(np.corrcoef(uniform_by_id(ids, 3, 0), uniform_by_id(ids, 3, 1))[0, 1]) < 0.01


def test_stream_epoch_through_ray_data_gives_each_row_once(ray_cluster):
    import ray.data

    from raydist.data.stream import stream_epoch

    ds = ray.data.from_items([{"sample_id": i} for i in range(2500)])
    batches = list(stream_epoch(ds, rows=96, shuffle_buffer=512, seed=0, epoch=0, rank=0))
    seen = np.concatenate([b["sample_id"] for b in batches])
    assert len(batches) == 2500 // 96 and all(len(b["sample_id"]) == 96 for b in batches)
    assert len(np.unique(seen)) == len(seen) and not np.array_equal(seen, np.sort(seen))  # shuffled, no repeats
