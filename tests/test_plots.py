"""Plots (raydist/plots.py): a finished in-process run gets its PNGs (and TensorBoard files) from
run_training, the SH → MH marker sits at the first MH step, label-task histories and Tune sweep folders."""

from __future__ import annotations

import json

import pytest
import yaml

from raydist.config import load_config
from raydist.plots import (
    NEGATIVE_STATS,
    SWITCH_LABEL,
    gradient_variance_figure,
    loss_figure,
    negatives_figure,
    phase_switch_step,
    plot_run,
    plot_sweep,
    sweep_best,
    val_figure,
)
from raydist.train.trainer import run_training

PNG = b"\x89PNG\r\n\x1a\n"


def _legend(ax):
    """The labels in the legend drawn on ``ax`` ([] without a legend)."""
    legend = ax.get_legend()
    return [text.get_text() for text in legend.get_texts()] if legend else []


def _assert_labelled(fig):
    """Every panel has both axis labels and a legend naming each of its plotted series."""
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_ylabel(), ax.get_title()
        series = [line.get_label() for line in ax.get_lines()] + [c.get_label() for c in ax.collections]
        assert series and set(series) <= set(_legend(ax)), (ax.get_title(), series, _legend(ax))


def _switch_lines(fig):
    return [line for ax in fig.axes for line in ax.get_lines() if line.get_label() == SWITCH_LABEL]


def test_a_finished_run_is_plotted_and_marks_the_switch_at_the_first_mh_step(small_pairs, tmp_path):
    cfg = load_config(
        "tiny",
        overrides={  # 200 rows: 6 steps per epoch (steps 5 and 10 logged)
            "data.path": str(small_pairs),
            "data.train_fraction": 0.5,
            "train.num_workers": 0,
            "train.epochs": 2,
            "train.storage_path": str(tmp_path),
            "train.run_name": "run",
        },
    )
    outcome = run_training(cfg, evaluate_test=False)
    run_dir = tmp_path / "run"
    assert [p.name for p in sorted((run_dir / "plots").iterdir())] == ["loss.png", "negatives.png", "val.png"]
    assert all(p.read_bytes().startswith(PNG) for p in (run_dir / "plots").iterdir())
    assert list(run_dir.glob("events.out.tfevents.*"))

    history = outcome.history
    assert [h["phase"] for h in history] == ["SH", "MH"]  # tiny: loss.warmup_sh_epochs=1
    steps_per_epoch = history[0]["step"]
    first_mh = next(i for i, h in enumerate(history) if h["phase"] == "MH") * steps_per_epoch + 1
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    (line,) = _switch_lines(loss_figure(history, steps))
    assert list(line.get_xdata()) == [first_mh, first_mh]
    logged = {e: [s["step"] for s in steps if s["epoch"] == e] for e in (1, 2)}
    assert max(logged[1]) < first_mh <= min(logged[2])
    val = val_figure(history)
    titles = [ax.get_title() for ax in val.axes]
    assert titles == [
        "val rsum",
        "val recall@K",
        "val median rank (lower is better)",
        "val mean rank (lower is better)",
    ]
    assert _legend(val.axes[1]) == [
        "i2t_r1",
        "i2t_r5",
        "i2t_r10",
        "t2i_r1",
        "t2i_r5",
        "t2i_r10",
        SWITCH_LABEL,
    ]
    for fig in (loss_figure(history, steps), val, negatives_figure(history, steps)):
        _assert_labelled(fig)
    negatives = negatives_figure(history, steps)
    assert [ax.get_title() for ax in negatives.axes] == list(NEGATIVE_STATS)
    assert all(
        _legend(ax)[0].startswith(ax.get_title()) and SWITCH_LABEL in _legend(ax) for ax in negatives.axes
    )


def test_phase_switch_step():
    history = [
        {"phase": phase, "step": step} for phase, step in (("SH", 10), ("SH", 20), ("MH", 30), ("MH", 40))
    ]
    assert phase_switch_step(history) == 21
    assert phase_switch_step([{"phase": "MH", "step": 10}, {"phase": "MH", "step": 20}]) is None
    assert phase_switch_step([{"phase": None, "step": 10}]) is None


def test_labels_history_without_steps(tmp_path):
    history = [
        {
            "epoch": e,
            "step": 50 * e,
            "phase": None,
            "train/loss": 2.0 / e,
            "val/top1": 40.0 + e,
            "val/r1": 30.0 + e,
            "val/nmi": 20.0 + e,
            "val/map10": 10.0 + e,
            "val/r2": 35.0 + e,
        }
        for e in (1, 2, 3)
    ]
    (tmp_path / "history.json").write_text(json.dumps(history))
    assert [p.name for p in plot_run(tmp_path, tmp_path / "out")] == ["loss.png", "val.png"]
    fig = val_figure(history)
    assert [(ax.get_title(), _legend(ax)) for ax in fig.axes] == [
        ("val top-1 accuracy", ["top1"]),
        ("val recall@K", ["r1", "r2"]),
        ("val mAP@k", ["map10"]),
        ("val NMI", ["nmi"]),
    ]
    _assert_labelled(fig)
    assert not _switch_lines(fig) and not _switch_lines(loss_figure(history, []))
    with pytest.raises(FileNotFoundError, match="neither history.json nor steps.jsonl"):
        plot_run(tmp_path / "empty")


def _fake_sweep(root):
    """A raydist sweep folder: the sweep file (mode min), trials with result.json or only progress.csv, a
    trial that never reported the metric, and Tune's own files."""
    root.mkdir()
    space = {
        "metric": "val/rsum",
        "mode": "min",
        "space": {"loss.margin": {"uniform": [0.1, 0.3]}, "train.lr": {"loguniform": [1e-5, 1e-2]}},
    }
    (root / "raydist_sweep.yaml").write_text(yaml.safe_dump({"name": "fake", "space": space, "config": {}}))
    (root / "experiment_state-x.json").write_text("{}")
    trials = {
        "trial_a": ({"loss.margin": 0.1, "train.lr": 1e-5}, [100.0, float("-inf"), 300.0]),
        "trial_b": ({"loss.margin": 0.2, "train.lr": 1e-3}, [250.0, 200.0]),
        "trial_c": ({"loss.margin": 0.3, "train.lr": 1e-2}, [50.0]),
    }
    for name, (values, rsums) in trials.items():
        (root / name).mkdir()
        (root / name / "params.json").write_text(json.dumps(values))
        reports = [{"epoch": i + 1, "val/rsum": r, "config": values} for i, r in enumerate(rsums)]
        if name == "trial_c":
            header = "epoch,val/rsum,train/loss\n"
            (root / name / "progress.csv").write_text(
                header + "".join(f"{r['epoch']},{r['val/rsum']},1.5\n" for r in reports)
            )
        else:
            (root / name / "result.json").write_text("".join(json.dumps(r) + "\n" for r in reports))
    (root / "trial_d").mkdir()
    (root / "trial_d" / "params.json").write_text(json.dumps({"loss.margin": 0.25, "train.lr": 1e-4}))
    (root / "trial_d" / "result.json").write_text(json.dumps({"epoch": 1, "train/loss": 3.0}) + "\n")


def test_plot_sweep_on_a_fake_sweep_folder(tmp_path):
    _fake_sweep(tmp_path / "exp")
    assert sweep_best(tmp_path / "exp", "val/rsum") == [  # the sweep file says mode: min
        ({"loss.margin": 0.1, "train.lr": 1e-5}, 100.0),
        ({"loss.margin": 0.2, "train.lr": 1e-3}, 200.0),
        ({"loss.margin": 0.3, "train.lr": 1e-2}, 50.0),
    ]
    assert [best for _, best in sweep_best(tmp_path / "exp", "val/rsum", mode="max")] == [300.0, 250.0, 50.0]
    paths = plot_sweep(tmp_path / "exp", "val/rsum")
    assert paths == [tmp_path / "exp" / "plots" / f"sweep-{k}.png" for k in ("loss.margin", "train.lr")]
    assert all(p.read_bytes().startswith(PNG) for p in paths)
    with pytest.raises(ValueError, match="no trial reported a finite 'val/missing'"):
        plot_sweep(tmp_path / "exp", "val/missing")
    with pytest.raises(FileNotFoundError, match="no trial_\\* folders"):
        plot_sweep(tmp_path, "val/rsum")


def test_plot_sweep_categorical_values(tmp_path):
    for name, (kind, rsum) in {"trial_1": ("triplet", 1.0), "trial_2": ("margin", 2.0)}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "params.json").write_text(json.dumps({"loss.kind": kind}))
        (tmp_path / name / "result.json").write_text(json.dumps({"val/r1": rsum}) + "\n")
    (path,) = plot_sweep(tmp_path, "val/r1", out_dir=tmp_path / "out")  # no sweep file: mode max
    assert path == tmp_path / "out" / "sweep-loss.kind.png" and path.read_bytes().startswith(PNG)


def test_gradient_variance_panels_are_labelled():
    history = [
        {
            "epoch": e,
            "step": 10 * e,
            "gvar/sgd_nvar": 1.0 / e,
            "gvar/gc_nvar": 0.5 / e,
            "gvar/gc_distortion": 2.0 + e,
        }
        for e in (1, 2)
    ]
    fig = gradient_variance_figure(history)
    _assert_labelled(fig)
    assert [_legend(ax) for ax in fig.axes] == [["SGD", "GC (stratified)"], ["GC (stratified)"]]
