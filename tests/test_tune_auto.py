"""`raydist train --auto` (raydist/tune/auto.py): the knobs searched for small encoded images (pairs and labels),
large ones, feature vectors and keys set on the command line; the trial plan and schedule; the driver's decoded
train split taken by in-process runs; and one real search on the session's Ray with the run after it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_tasks_images import write_colour_folders, write_shape_pairs

from raydist.cli import main
from raydist.config import load_config
from raydist.recipe import run_recipe
from raydist.tasks import DataInfo, build_task
from raydist.tasks.images import augmentation
from raydist.train.local import LocalRuntime, SharedSplit
from raydist.train.plan import resolve_schedule, step_plan
from raydist.tune.auto import asha_grace, auto_knobs, plan_trials, trial_base, trial_threads

IMAGE_KNOBS = ["train.lr", "data.crop", "data.crop_pad", "data.flip", "model.cnn_width", "model.cnn_grid"]
# what the small shapes need to train at all: a batch the 108 train images hold (3 steps an epoch), a short schedule
SMALL = {"train.batch_size": "36", "train.min_steps": "0", "train.epochs": "4"}


@pytest.fixture(scope="module")
def shapes_data(tmp_path_factory):
    """Encoded pairs: 16×16 coloured shapes, 9 classes × 12 train images, 4 val and 4 test each."""
    return write_shape_pairs(
        tmp_path_factory.mktemp("auto-shapes"),
        per_class={"train": 12, "val": 4, "test": 4},
        rows_per_shard=40,
    )


@pytest.fixture(scope="module")
def colour_labels(tmp_path_factory):
    """Encoded labels from an ImageFolder tree: 3 colours of 16×16 shapes, 24 images each."""
    return write_colour_folders(tmp_path_factory.mktemp("auto-colours"), seed=1)


def knobs_of(data, overrides=None):
    """The knobs `raydist train --data DATA key=value …` searches, with the resolved config they start from."""
    overrides = dict(overrides or {})
    cfg = run_recipe(data, overrides=overrides).config
    full, _ = resolve_schedule(cfg, DataInfo.from_dataset(Path(data)))
    return auto_knobs(full, DataInfo.from_dataset(data), fixed=overrides), full


@pytest.mark.parametrize("fixture", ["shapes_data", "colour_labels"])
def test_small_encoded_images_search_lr_crop_flip_and_the_cnn(fixture, request):
    data = request.getfixturevalue(fixture)
    knobs, full = knobs_of(data, SMALL)
    pairs = fixture == "shapes_data"
    assert [k.key for k in knobs] == IMAGE_KNOBS + (
        ["loss.hardest"] if pairs else []
    )  # labels do not read it
    by = {k.key: k for k in knobs}
    lr = full.train.lr
    assert by["train.lr"].spec == {"loguniform": [pytest.approx(0.3 * lr), pytest.approx(3 * lr)]}
    assert by["train.lr"].default == lr
    assert by["data.crop"].spec == {"choice": ["pad", "none"]} and by["data.crop"].default == "pad"  # ≤ 64 px
    assert by["data.crop_pad"].spec == {"randint": [1, 5]} and by["data.crop_pad"].default == 2  # 16 px / 8
    flip = augmentation(full, DataInfo.from_dataset(data)).flip
    assert by["data.flip"].spec == {"choice": [True, False]} and by["data.flip"].default is flip
    assert by["model.cnn_width"].spec == {"choice": [16, 32, 48]} and by["model.cnn_width"].default == 32
    assert by["model.cnn_grid"].spec == {"choice": [1, 2, 3]} and by["model.cnn_grid"].default == 2
    if pairs:
        assert by["loss.hardest"].spec == {"choice": [True, False]}
        assert by["loss.hardest"].default is full.loss.hardest


def test_large_images_search_the_resized_crops_area():
    info = DataInfo("pairs", None, None, None, {}, "encoded", 3, (375, 500))
    cfg = load_config(
        "tiny",
        overrides={"model.image_encoder": "small-cnn", "data.flip": True, "data.crop_scale": [0.3, 1.0]},
    )
    by = {k.key: k for k in auto_knobs(cfg, info)}
    assert "data.crop" not in by and "data.crop_pad" not in by
    assert by["data.crop_scale"].spec == {
        "choice": [[0.08, 1.0], [0.2, 1.0], [0.3, 1.0], [0.35, 1.0], [0.5, 1.0]]
    }
    assert by["data.crop_scale"].default == [0.3, 1.0]


def test_feature_vectors_search_lr_and_mh_only(tiny_dataset, labels_dataset):
    knobs, _ = knobs_of(tiny_dataset)
    assert [k.key for k in knobs] == ["train.lr", "loss.hardest"]
    knobs, _ = knobs_of(labels_dataset)
    assert [k.key for k in knobs] == ["train.lr"]  # the labels task has no MH/SH switch


def test_keys_set_on_the_command_line_stay_fixed(shapes_data):
    knobs, full = knobs_of(
        shapes_data, {**SMALL, "train.lr": "0.01", "loss.hardest": "true", "model.cnn_grid": "1"}
    )
    assert [k.key for k in knobs] == ["data.crop", "data.crop_pad", "data.flip", "model.cnn_width"]
    assert (full.train.lr, full.loss.hardest, full.model.cnn_grid) == (0.01, True, 1)
    knobs, _ = knobs_of(shapes_data, {**SMALL, "data.crop": "none"})  # no crop: no padding to search either
    assert [k.key for k in knobs] == [
        "train.lr",
        "data.flip",
        "model.cnn_width",
        "model.cnn_grid",
        "loss.hardest",
    ]
    knobs, _ = knobs_of(shapes_data, {**SMALL, "model.image_encoder": "small-cnn", "data.crop_pad": "3"})
    assert "model.cnn_width" in [k.key for k in knobs] and "data.crop_pad" not in [k.key for k in knobs]


def test_trial_plan_fits_the_budget():
    # 10 steps of 0.5 s + a 1 s validation = 6 s an epoch; 300 s × 2 at a time / 6 trials = 100 s each: 5 s to
    # start, then 15 epochs -- capped at a third of the run's 30 epochs
    assert plan_trials(
        seconds=300, step_s=0.5, eval_s=1, steps_per_epoch=10, full_epochs=30, concurrent=2
    ) == (10, 6)
    assert plan_trials(
        seconds=300, step_s=0.5, eval_s=1, steps_per_epoch=10, full_epochs=90, concurrent=2
    ) == (15, 6)
    # not one epoch each: fewer trials of one epoch, never fewer than the defaults and one draw
    assert plan_trials(seconds=60, step_s=2, eval_s=10, steps_per_epoch=20, full_epochs=30, concurrent=2) == (
        1,
        2,
    )
    assert plan_trials(
        seconds=200, step_s=2, eval_s=10, steps_per_epoch=20, full_epochs=30, concurrent=2
    ) == (1, 6)
    assert trial_threads(2) == (2, 1) and trial_threads(16) == (4, 4) and trial_threads(1) == (1, 1)
    # ASHA judges a trial after a ninth of it and at least 20 steps, never after the whole trial
    assert asha_grace(90, 100) == 10 and asha_grace(25, 8) == 3 and asha_grace(5, 8) == 3
    assert asha_grace(2, 3) == 2 and asha_grace(1, 1000) == 1


def test_a_trial_is_the_full_schedule_cut_short(shapes_data):
    cfg = run_recipe(
        shapes_data,
        overrides={
            **SMALL,
            "train.epochs": "30",
            "train.lr_decay_epoch": "24",
            "train.lr_decay_factor": "0.1",
        },
    ).config
    full, _ = resolve_schedule(cfg, DataInfo.from_dataset(Path(shapes_data)))
    trial = trial_base(full, 10, threads=1)
    assert (trial.train.epochs, trial.train.lr_decay_epoch, trial.train.min_steps) == (10, 8, 0)
    assert (trial.train.num_workers, trial.train.cpus_per_worker, trial.train.run_name) == (0, 1, "")
    assert (
        resolve_schedule(trial, DataInfo.from_dataset(Path(shapes_data)))[0].train.epochs == 10
    )  # no step floor raises it again


def test_an_in_process_run_takes_a_shared_split_that_fits_it(colour_labels, tmp_path):
    cfg = load_config(
        "tiny",
        overrides={
            "data.path": str(colour_labels),
            "model.image_encoder": "small-cnn",
            "train.num_workers": 0,
            "train.batch_size": 12,
        },
    )
    info = DataInfo.from_dataset(colour_labels)
    task = build_task(cfg, info)
    shared = SharedSplit.read(cfg, task)
    assert shared.arrays["image"].dtype == object and shared.arrays["image"][0].ndim == 3  # decoded pixels
    plan = step_plan(cfg, task.info.task)
    runtime = LocalRuntime(cfg, task, plan, tmp_path / "a", shared=shared)
    assert runtime.arrays is shared.arrays
    other = load_config(
        "tiny",
        overrides={
            "data.path": str(colour_labels),
            "model.image_encoder": "small-cnn",
            "train.num_workers": 0,
            "train.batch_size": 12,
            "train.seed": 1,
        },
    )
    runtime = LocalRuntime(other, build_task(other, info), plan, tmp_path / "b", shared=shared)
    assert runtime.arrays is not shared.arrays  # another seed draws another subset: read anew
    np.testing.assert_array_equal(np.sort(runtime.arrays["sample_id"]), np.sort(shared.arrays["sample_id"]))
    assert shared.travels()  # a trial's process can tell it fits


def test_a_split_no_other_process_could_match_is_not_shared(tiny_dataset):
    cfg = load_config("tiny", overrides={"data.path": str(tiny_dataset)})
    shared = SharedSplit.read(cfg, build_task(cfg, DataInfo.from_dataset(tiny_dataset)))
    assert not shared.travels()  # captions tokenised by a tokenizer object, equal only to itself


def test_cli_refuses_auto_with_what_it_cannot_do(capsys):
    assert main(["train", "--budget", "2"]) == 2
    assert "--budget is the --auto search's minutes" in capsys.readouterr().err
    assert main(["train", "--auto", "--print-config"]) == 2
    assert "drop --resume/--print-config" in capsys.readouterr().err


def trial_results(experiment: Path, metric: str) -> dict[str, tuple[dict, list[dict]]]:
    """Each trial's config and reports, as Tune recorded them (its ExperimentAnalysis)."""
    from ray.tune import ExperimentAnalysis

    analysis = ExperimentAnalysis(str(experiment))
    out = {}
    for trial in analysis.trials:
        df = analysis.trial_dataframes.get(trial.trial_id)
        reports = [] if df is None or metric not in df else df.dropna(subset=[metric]).to_dict("records")
        out[Path(trial.path).name] = (trial.config, reports)
    return out


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_auto_searches_from_the_defaults_and_trains_the_winner(
    ray_cluster, shapes_data, tmp_path, monkeypatch, capsys
):
    from raydist.checkpoint import load_checkpoint
    from raydist.tune import auto

    monkeypatch.setattr(auto, "TRIALS", 1)  # 1 × 3 draws: the defaults and two more
    monkeypatch.setattr(auto, "TRIAL_DRAWS", 3)
    storage = tmp_path / "runs"
    args = [
        "train",
        "--data",
        str(shapes_data),
        "--auto",
        "--budget",
        "2",
        "--storage",
        str(storage),
        *(f"{k}={v}" for k, v in SMALL.items()),
        "train.num_workers=0",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    (run_dir,) = storage.iterdir()
    (experiment,) = run_dir.glob("tune-auto-*")
    results = trial_results(experiment, "val/rsum")
    assert len(results) == 3

    # the defaults were the first trial: the recipe's own values, written out here
    cfg = run_recipe(shapes_data, overrides=SMALL).config
    info = DataInfo.from_dataset(shapes_data)
    defaults = {
        "train.lr": cfg.train.lr,
        "data.crop": "pad",
        "data.crop_pad": 2,
        "data.flip": augmentation(cfg, info).flip,
        "model.cnn_width": 32,
        "model.cnn_grid": 2,
        "loss.hardest": cfg.loss.hardest,
    }
    first = min(results)  # trial ids count up: <prefix>_00000 is the first
    assert {k: results[first][0][k] for k in defaults} == defaults

    # the winner is the trial with the best val/rsum Tune recorded, over every report of every trial
    best_value, best = max(
        (r["val/rsum"], name)
        for name, (_, reports) in results.items()
        for r in reports
        if math.isfinite(r["val/rsum"])
    )
    winner = results[best][0]
    preset = run_dir / auto.AUTO_CONFIG_FILE
    written = load_config(preset_file=str(preset))
    for key in defaults:
        section, name = key.split(".")
        assert getattr(getattr(written, section), name) == pytest.approx(winner[key]), key
    assert f"[raydist] auto: val/rsum {best_value:.4g}" in out or "the defaults won" in out

    # the run trained the winner's values on the full schedule, in the run folder that holds the search
    best_checkpoint = json.loads((run_dir / "best_checkpoint.json").read_text())["checkpoint"]
    _, saved, _ = load_checkpoint(run_dir / best_checkpoint)
    for key in defaults:
        section, name = key.split(".")
        assert getattr(getattr(saved, section), name) == pytest.approx(winner[key]), key
    assert (
        saved.train.epochs == 4 and saved.train.run_name == run_dir.name
    )  # trials ran 2 (a third, rounded up)
    assert all(len(reports) <= 2 for _, reports in results.values())

    # the console: a line per trial start and end, one per knob; the trials' own lines went to their folders
    for name in results:
        assert f"[raydist] trial {name} started: train.lr=" in out
        assert f"[raydist] trial {name} finished: " in out or f"[raydist] trial {name} failed: " in out
    for key in defaults:
        assert f"[raydist] auto:   {key} " in out
    console = (experiment / first / "train" / "console.log").read_text()
    assert "shared by the driver, not read again" in console and "epoch 1/" in console

    # the preset reruns the winner
    capsys.readouterr()
    assert main(["train", "--preset-file", str(preset), "--print-config"]) == 0
    rerun = yaml.safe_load(capsys.readouterr().out)
    assert rerun["train"]["lr"] == pytest.approx(winner["train.lr"]) and rerun["train"]["run_name"] == ""


def test_the_lines_name_each_pick_and_no_winner_trains_the_defaults(shapes_data, tmp_path, capsys):
    from raydist.tune.auto import _decide
    from raydist.tune.sweep import SweepOutcome, TrialRow

    knobs, full = knobs_of(shapes_data, SMALL)
    run_cfg = run_recipe(shapes_data, overrides={**SMALL, "train.run_name": "r"}).config
    defaults = {k.key: k.default for k in knobs}
    drawn = {**defaults, "train.lr": 0.002, "model.cnn_width": 48}
    rows = [
        TrialRow("trial_a_00000", defaults, 300.0, 2, "TERMINATED", note="all epochs"),
        TrialRow("trial_a_00001", drawn, 320.0, 2, "TERMINATED", note="all epochs"),
    ]
    sweep = SweepOutcome(
        str(tmp_path / "tune-auto-x"), "val/rsum", list(defaults), rows, "trial_a_00001", None, None
    )
    out = _decide(run_cfg, knobs, sweep, defaults, tmp_path / "r", 90.0)
    assert (out.config.train.lr, out.config.model.cnn_width, out.config.train.run_name) == (0.002, 48, "r")
    assert out.defaults is rows[0] and out.winner is rows[1]
    lines = capsys.readouterr().out.splitlines()
    assert "[raydist] auto: 2 trials in 1.5 min (2 all epochs); trial_a_00001 won:" in lines
    assert f"[raydist] auto:   train.lr        0.002 (default {full.train.lr:.4g})" in lines
    assert "[raydist] auto:   data.crop       pad (the default)" in lines
    assert "[raydist] auto: val/rsum 320 (2 epochs) vs the defaults' 300 (2 epochs)" in lines
    written = load_config(preset_file=out.preset_path)
    assert (written.train.lr, written.model.cnn_width, written.train.run_name) == (0.002, 48, "")

    cut = [TrialRow("trial_b_00000", defaults, None, 0, "UNFINISHED")]
    sweep = SweepOutcome(str(tmp_path / "tune-auto-y"), "val/rsum", list(defaults), cut, None, None, None)
    out = _decide(run_cfg, knobs, sweep, defaults, tmp_path / "r2", 60.0)
    assert out.config == run_cfg and out.preset_path is None and out.winner is None
    assert "the budget ended before any of 1 trials finished an epoch" in capsys.readouterr().out
