"""raydist.train.plan: a run is resolved once. An in-process run (``train.num_workers=0``, pairs and labels), its
config load included, reads its dataset's manifest at most twice (the config's task; the run plan, whose facts the
best checkpoint's evaluation reuses) and builds its task at most twice (the run plan's; the loaded checkpoint's)
-- counted at the file and the Task constructor, so no caller can read past the count. A plan's schedule and checks are those of
the pieces it asks."""

from __future__ import annotations

import collections
import pathlib

import pytest

from raydist.config import ConfigError, load_config
from raydist.data import RaydistDataError
from raydist.data.schema import MANIFEST_NAME
from raydist.tasks import DataInfo
from raydist.tasks.base import Task
from raydist.train.plan import prepare_run, resolve_schedule
from raydist.train.trainer import run_training


@pytest.fixture
def counted(monkeypatch):
    """Counts of manifest file reads and Task constructions while the test runs."""
    counts: collections.Counter[str] = collections.Counter()
    read_text, read_bytes, task_init = pathlib.Path.read_text, pathlib.Path.read_bytes, Task.__init__

    def counting(read):
        def wrapped(self, *args, **kwargs):
            if self.name == MANIFEST_NAME:
                counts["manifest"] += 1
            return read(self, *args, **kwargs)

        return wrapped

    def init(self, *args, **kwargs):
        counts["task"] += 1
        task_init(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_text", counting(read_text))
    monkeypatch.setattr(pathlib.Path, "read_bytes", counting(read_bytes))
    monkeypatch.setattr(Task, "__init__", init)
    return counts


@pytest.mark.parametrize("data", ["tiny_dataset", "labels_dataset"])
def test_an_in_process_run_reads_its_manifest_and_builds_its_task_at_most_twice(
    data, counted, tmp_path, request
):
    folder = request.getfixturevalue(data)
    cfg = load_config(
        "tiny",
        overrides={
            "data.path": str(folder),
            "train.num_workers": 0,
            "train.epochs": 2,
            "train.epoch_steps": 3,
            "train.storage_path": str(tmp_path / "runs"),
        },
    )
    outcome = run_training(cfg)
    assert outcome.test_metrics and len(outcome.history) == 2  # a whole run: two epochs, then the test split
    assert counted["manifest"] <= 2, counted
    assert counted["task"] <= 2, counted


def test_the_counter_sees_every_read(tiny_dataset, counted):
    """The fixture can fail: reading the manifest and building tasks outside a plan is counted."""
    for _ in range(3):
        DataInfo.from_dataset(tiny_dataset)
    assert counted["manifest"] == 3


def test_a_plan_resolves_the_schedule_of_its_dataset_and_refuses_what_does_not_fit(tiny_dataset):
    cfg = load_config("tiny", overrides={"data.path": str(tiny_dataset), "train.min_steps": 500})
    plan = prepare_run(cfg)
    steps = 2000 // cfg.train.batch_size  # 400 images × 5 captions
    assert plan.cfg.train.epochs == -(-500 // min(steps, cfg.train.epoch_steps)) > cfg.train.epochs  # raised
    assert plan.cfg == resolve_schedule(cfg, DataInfo.from_dataset(tiny_dataset))[0]
    assert plan.task.cfg is plan.cfg and plan.info.manifest.splits["train"].rows == 2000
    assert plan.step_plan(2).rows_per_step == cfg.train.batch_size
    with pytest.raises(
        RaydistDataError, match="fewer than one global batch of 4096"
    ):  # larger than the split
        prepare_run(load_config("tiny", overrides={"data.path": str(tiny_dataset), "train.batch_size": 4096}))


def test_an_explicit_epochs_is_kept_over_a_presets_min_steps(tiny_dataset, tmp_path):
    """Issue #51: ``train.epochs=1`` on the command line is a 1-epoch run (the default preset's min_steps=585
    would raise it), and the schedule says what min_steps would have done; with epochs left to the preset, or
    set in the same layer as min_steps, the raise stays."""
    steps = 2000 // 128  # tiny_dataset: 400 images × 5 captions; the default preset's global batch 128
    would = -(-585 // steps)
    explicit = prepare_run(
        load_config("default", overrides={"data.path": str(tiny_dataset), "train.epochs": 1})
    )
    assert explicit.cfg.train.epochs == 1 and explicit.cfg.train.min_steps == 0
    assert (
        f"would have raised it to {would} epochs" in explicit.schedule
        and "train.min_steps=585" in explicit.schedule
    )
    preset = prepare_run(load_config("default", overrides={"data.path": str(tiny_dataset)}))
    assert preset.cfg.train.epochs == would and "would have" not in preset.schedule
    both = tmp_path / "both.yaml"
    both.write_text("train:\n  epochs: 1\n  min_steps: 100\n")
    same_layer = prepare_run(
        load_config(preset_file=both, overrides={"data.path": str(tiny_dataset), "train.batch_size": 128})
    )
    assert same_layer.cfg.train.epochs == -(-100 // steps)


def test_mining_on_a_split_smaller_than_k_plus_hi_is_refused_naming_the_keys(tiny_dataset):
    """Issue #47's bad input: K mined negatives from ranks [lo, hi] need a train split of K + hi rows or more."""
    base = {"data.path": str(tiny_dataset), "loss.mined_negatives": 4}
    ok = load_config("tiny", overrides={**base, "loss.mine_range": [1, 1996]})  # 2000 train rows = 4 + 1996
    prepare_run(ok)
    too_far = load_config("tiny", overrides={**base, "loss.mine_range": [1, 1997]})
    with pytest.raises(
        ConfigError, match=r"loss.mine_range=\[1, 1997\] with loss.mined_negatives=4: .* 2000 rows"
    ):
        prepare_run(too_far)
