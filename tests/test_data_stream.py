"""Train batches: the in-memory split (equal, disjoint per-rank batches, reshuffled per epoch), id-based
subsets and per-id random numbers."""

from __future__ import annotations

import numpy as np
import pytest

from raydist.data.hashing import uniform_by_id
from raydist.data.stream import InMemoryBatches, local_batches, read_tasks
from raydist.data.transforms import train_subset


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


@pytest.mark.slow
def test_stream_epoch_through_ray_data_gives_each_row_once(ray_cluster):
    import ray.data

    from raydist.data.stream import stream_epoch

    ds = ray.data.from_items([{"sample_id": i} for i in range(2500)])
    batches = list(stream_epoch(ds, rows=96, shuffle_buffer=512, seed=0, epoch=0, rank=0))
    seen = np.concatenate([b["sample_id"] for b in batches])
    assert len(batches) == 2500 // 96 and all(len(b["sample_id"]) == 96 for b in batches)
    assert len(np.unique(seen)) == len(seen) and not np.array_equal(
        seen, np.sort(seen)
    )  # shuffled, no repeats


def _blocks(n: int, size: int) -> list[dict[str, np.ndarray]]:
    x = np.arange(n)
    return [
        {"x": x[i : i + size], "pair": np.stack([x[i : i + size], -x[i : i + size]], 1)}
        for i in range(0, n, size)
    ]


def test_local_batches_keep_order_without_a_generator():
    batches = list(local_batches(iter(_blocks(1000, 77)), rows=64, shuffle_buffer=0, rng=None))
    assert len(batches) == 1000 // 64 and all(len(b["x"]) == 64 for b in batches)
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in batches]), np.arange(1000 // 64 * 64))
    assert all((b["pair"][:, 0] == b["x"]).all() and (b["pair"][:, 1] == -b["x"]).all() for b in batches)


def test_local_batches_shuffle_each_row_once_and_deterministically():
    def run(seed):
        rng = np.random.default_rng(seed)
        return list(local_batches(iter(_blocks(5003, 700)), rows=64, shuffle_buffer=1024, rng=rng))

    batches = run(3)
    seen = np.concatenate([b["x"] for b in batches])
    assert len(batches) == 5003 // 64 and all(len(b["x"]) == 64 for b in batches)
    assert len(np.unique(seen)) == len(seen)  # every row at most once
    assert all((b["pair"][:, 0] == b["x"]).all() and (b["pair"][:, 1] == -b["x"]).all() for b in batches)
    assert [b["x"].tolist() for b in batches] == [b["x"].tolist() for b in run(3)]
    assert [b["x"].tolist() for b in batches] != [b["x"].tolist() for b in run(4)]
    # a batch only holds rows that have arrived, and is drawn from at least shuffle_buffer + rows of them
    first = batches[0]["x"]
    assert first.max() < 1400 and len(np.unique(first // 700)) == 2  # two blocks of 700 needed for 1088 rows
    # mixed over the whole buffer, not taken from its head
    assert abs(np.mean([b["x"].mean() for b in batches[:3]]) - 700) < 150


def test_local_batches_handle_empty_and_short_streams():
    rng = np.random.default_rng(0)
    assert list(local_batches(iter([]), rows=8, shuffle_buffer=16, rng=rng)) == []
    assert list(local_batches(iter(_blocks(7, 7)), rows=8, shuffle_buffer=0, rng=None)) == []
    empty = {"x": np.arange(0), "pair": np.zeros((0, 2), dtype=np.int64)}
    batches = list(local_batches(iter([empty, *_blocks(20, 5), empty]), rows=8, shuffle_buffer=100, rng=rng))
    assert len(batches) == 2 and len(np.unique(np.concatenate([b["x"] for b in batches]))) == 16


def test_read_tasks_group_shards_by_feature_size(tmp_path, monkeypatch):
    from raydist.data import make_synthetic, stream

    out = make_synthetic(
        tmp_path / "ds",
        images=60,
        captions_per_image=5,
        dim=8,
        val_images=4,
        test_images=4,
        rows_per_shard=30,
    )
    size_mb = 300 * 8 * 4 / 2**20  # train rows × dim × float32
    assert read_tasks(out, 10) == 4  # tiny features: the floor of min(files, 4)
    assert read_tasks(out, 2) == 2  # never more tasks than shards
    monkeypatch.setattr(stream, "READ_TASK_MB", size_mb / 6.5)
    assert read_tasks(out, 10) == 7  # ceil(6.5)
    monkeypatch.setattr(stream, "READ_TASK_MB", size_mb / 100)
    assert read_tasks(out, 10) == 10


class _FakeShard:
    """A shard whose passes are counted: each ``iter_batches`` call is one pass over the same blocks."""

    def __init__(self, blocks: list[dict[str, np.ndarray]]) -> None:
        self.blocks, self.opened = blocks, 0

    def iter_batches(self, **kwargs):
        self.opened += 1
        return iter([{k: v.copy() for k, v in b.items()} for b in self.blocks])


def test_streamed_epochs_open_the_next_pass_ahead_and_none_beyond_the_last():
    from raydist.data.stream import StreamedEpochs, stream_epoch

    blocks = [{"x": np.arange(s, s + 50)} for s in range(0, 200, 50)]
    shard = _FakeShard(blocks)
    epochs = StreamedEpochs([shard], rows=16, shuffle_buffer=32, seed=3, rank=1, epochs=2)
    batches = epochs.epoch(0)
    first = [next(batches)]
    assert shard.opened == 1 and epochs._ahead is None
    first += list(batches)
    epochs._ahead[1].result()  # the next pass, opened in the background when epoch 0's last block arrived
    assert shard.opened == 2
    second = list(epochs.epoch(1))
    assert shard.opened == 2 and epochs._ahead is None  # epoch 1 is the last: nothing opened beyond it
    for got, epoch in ((first, 0), (second, 1)):  # the same batches as a pass opened on the spot
        want = list(stream_epoch(_FakeShard(blocks), rows=16, shuffle_buffer=32, seed=3, epoch=epoch, rank=1))
        assert [b["x"].tolist() for b in got] == [b["x"].tolist() for b in want]
    assert [b["x"].tolist() for b in first] != [b["x"].tolist() for b in second]  # reshuffled per epoch


def test_stream_transforms_unpickle_without_torch(tiny_dataset, labels_dataset):
    """What Ray Data's tasks run (the train subset around each task's ``stream_transform``) unpickles in a fresh
    interpreter without importing torch, and transforms a shard batch exactly as the task's own ``transform``."""
    import pickle
    import subprocess
    import sys

    from raydist.config import load_config
    from raydist.data.stream import split_columns
    from raydist.data.transforms import train_transform
    from raydist.tasks import DataInfo, build_task

    for data in (tiny_dataset, labels_dataset):
        cfg = load_config("tiny", overrides={"data.path": str(data), "data.label_noise": 0.2})
        task = build_task(cfg, DataInfo.from_dataset(data))
        fn = train_transform(task.stream_transform(), 1.0, 0)
        check = "import pickle, sys; pickle.loads(sys.stdin.buffer.read()); print('torch' in sys.modules)"
        out = subprocess.run(
            [sys.executable, "-c", check], input=pickle.dumps(fn), capture_output=True, check=True
        )
        assert out.stdout.decode().strip() == "False", out.stderr.decode()[-500:]
        batch = split_columns(data, "train", task.columns)
        got, want = pickle.loads(pickle.dumps(fn))(batch), task.transform(batch)
        assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)


def test_streamed_epochs_on_two_splits_alternate_and_open_the_next_pass_when_one_starts():
    from raydist.data.stream import StreamedEpochs, stream_epoch

    blocks = [{"x": np.arange(s, s + 50)} for s in range(0, 200, 50)]
    even, odd = _FakeShard(blocks), _FakeShard(blocks)
    epochs = StreamedEpochs([even, odd], rows=16, shuffle_buffer=32, seed=3, rank=1, epochs=3)
    got = {0: epochs.epoch(0)}
    epochs._ahead[1].result()  # epoch 1, opened on the other split as soon as epoch 0 started
    assert (even.opened, odd.opened, epochs._ahead[0]) == (1, 1, 1)
    got[0] = list(got[0])
    got[1] = epochs.epoch(1)
    epochs._ahead[1].result()
    assert (even.opened, odd.opened, epochs._ahead[0]) == (2, 1, 2)
    got[1], got[2] = list(got[1]), list(epochs.epoch(2))
    assert (even.opened, odd.opened, epochs._ahead) == (2, 1, None)  # epoch 2 is the last: nothing beyond it
    for epoch, batches in got.items():  # the same batches as a pass opened on the spot
        want = list(stream_epoch(_FakeShard(blocks), rows=16, shuffle_buffer=32, seed=3, epoch=epoch, rank=1))
        assert [b["x"].tolist() for b in batches] == [b["x"].tolist() for b in want]
    with pytest.raises(ValueError, match="one split or two"):
        StreamedEpochs([even, odd, even], rows=16, shuffle_buffer=32, seed=3, rank=1, epochs=3)
