"""Everyday CLI paths, run as a user would: in-process runs keep their run folder, resume takes the
checkpoint's config, eval checks the data and finds the recorded dataset, errors and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from raydist.checkpoint import has_state
from raydist.cli import main
from raydist.data import make_synthetic
from raydist.train.loop import Progress, samples_per_s


def _train(tmp_path: Path, data: Path, *extra: str) -> tuple[int, dict]:
    out = tmp_path / f"outcome-{len(list(tmp_path.glob('outcome-*')))}.json"
    code = main(
        [
            "train",
            "--preset",
            "tiny",
            "--data",
            str(data),
            "--storage",
            str(tmp_path / "runs"),
            "--json",
            str(out),
            "train.num_workers=0",
            *extra,
        ]
    )
    return code, (json.loads(out.read_text()) if out.exists() else {})


def test_version():
    out = subprocess.run(
        [sys.executable, "-m", "raydist.cli", "--version"], check=False, capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.startswith("raydist ")


@pytest.mark.timeout(240)
def test_in_process_run_resume_and_eval(small_pairs, tmp_path, capsys):  # 400 rows: any data will do
    code, first = _train(tmp_path, small_pairs, "train.epochs=1", "--name", "run1")
    assert code == 0
    run = Path(first["run_dir"])
    assert run == tmp_path / "runs" / "run1" and (run / "history.json").is_file()
    assert first["best_checkpoint"] and has_state(first["best_checkpoint"])
    assert first["test_metrics"]["rsum"] > 0
    printed = capsys.readouterr().out
    assert "== test split, best checkpoint ==" in printed and "raydist eval --checkpoint" in printed
    # the start-up marks the CLI prints and records (in-process: no Ray, so imports and the first step only)
    marks = first["startup"]
    assert marks["launch"] <= marks["imports"] <= marks["first_step"] == first["first_step_unix"]
    assert "[raydist] start-up: imports " in printed and ", first step " in printed

    # --resume takes the checkpoint's config (tiny, not the default preset) and says what changed
    out = tmp_path / "resumed.json"
    code = main(
        [
            "train",
            "--resume",
            str(run),
            "--storage",
            str(tmp_path / "runs"),
            "--name",
            "run2",
            "--json",
            str(out),
            "train.epochs=2",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "changed: train.epochs: 1 -> 2" in printed
    resumed = json.loads(out.read_text())
    assert [m["epoch"] for m in resumed["history"]] == [1, 2] and resumed["resumed_at"] == [
        first["history"][-1]["step"]
    ]
    # ... and refuses keys that shape the saved model, before any work
    assert main(["train", "--resume", str(run), "model.embed_dim=128"]) == 2
    assert "cannot change model.embed_dim" in capsys.readouterr().err

    # eval without --data uses the dataset recorded in the checkpoint
    assert main(["eval", "--checkpoint", first["best_checkpoint"], "--split", "val"]) == 0
    assert "rsum" in capsys.readouterr().out
    # a dataset with other feature dims is refused, naming both sides
    other = make_synthetic(tmp_path / "other", images=100, val_images=50, test_images=50, dim=16, seed=1)
    assert main(["eval", "--checkpoint", first["best_checkpoint"], "--data", str(other)]) == 2
    err = capsys.readouterr().err
    assert "feature_dim: checkpoint=32 data=16" in err


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_failed_run_is_one_error_line_and_exit_1(ray_cluster, tiny_dataset, tmp_path, capsys):
    code = main(
        [
            "train",
            "--preset",
            "tiny",
            "--data",
            str(tiny_dataset),
            "--storage",
            str(tmp_path),
            "train.epochs=1",
            "debug.fail_at_step=2",
            "train.max_failures=0",
        ]
    )
    assert code == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("raydist: error:")]
    assert len(err) == 1 and "training failed" in err[0] and "full log:" in err[0]


def test_progress_line_counts_and_eta():
    p = Progress(epochs=2, steps_per_epoch=10, rows_per_step=64)
    p.times = [0.0, 1.0, 2.0]  # 2 steps in 2 s → 1 step/s
    line = p.line(epoch=0, step_in_epoch=5)
    assert line.startswith("epoch 1/2 step 5/10 (50%)") and "samples/s 64" in line and "ETA 0m15s" in line


def test_samples_per_s_is_one_definition_for_progress_lines_epochs_and_the_step_benchmark():
    from raydist.benchmarks.step import WARM_STEPS, steps_per_s

    ends = [10.0, 10.5, 11.0, 12.0]  # the first step ends at 10 s; 3 more steps take 2 s
    assert samples_per_s(ends, 64) == pytest.approx(64 * 3 / 2)
    p = Progress(epochs=1, steps_per_epoch=4, rows_per_step=64, window=2)
    for t in ends:
        p.times.append(t)
    assert p.epoch_samples_per_s() == pytest.approx(96.0)
    assert "samples/s 85 " in p.line(epoch=0, step_in_epoch=4)  # last 2 steps: 64 × 2 / 1.5 s
    p.start_epoch()  # validation between epochs is not training time
    assert p.epoch_samples_per_s() == 0.0 and p.times == []
    bench_ends = [0.0, 3.0, 5.0, 5.5, 6.0, 7.0]  # the benchmark leaves out the first WARM_STEPS steps
    assert steps_per_s(bench_ends) * 64 == pytest.approx(samples_per_s(bench_ends[WARM_STEPS - 1 :], 64))
    assert steps_per_s(bench_ends) == pytest.approx(
        (len(bench_ends) - WARM_STEPS) / (7.0 - bench_ends[WARM_STEPS - 1])
    )


def test_every_help_shows_real_defaults_once_and_no_empty_ones():
    from raydist.cli import build_parser

    commands = build_parser().parse_args(["train"]).commands
    assert {"train", "eval", "tune", "retrieve", "experiment"} <= set(commands)
    for name, command in commands.items():
        text = " ".join(command.format_help().split())
        assert "(default: None)" not in text and "(default: False)" not in text, name
    assert "(default: 10)" in " ".join(commands["retrieve"].format_help().split())  # --k
    tune = " ".join(
        commands["tune"].format_help().split()
    )  # a help that states its default gets no second one
    assert "(default: the embedded synthetic dataset, cached) --preset" in tune


def test_make_data_without_a_kind_makes_the_embedded_set_and_data_path_prints_it(capsys):
    from raydist.data import ensure_default_dataset, load_manifest

    embedded = ensure_default_dataset()
    assert main(["make-data"]) == 0
    shown = capsys.readouterr().out
    assert f"embedded dataset: {embedded}" in shown
    manifest = load_manifest(embedded)
    train = manifest.splits["train"]  # features pairs: one row per caption
    assert f"train{train.images:>9,} images{train.rows:>9,} captions".replace(" ", "") in shown.replace(
        " ", ""
    )
    assert main(["data", "path"]) == 0 and capsys.readouterr().out.strip() == str(embedded)
    assert main(["make-data", "synthetic"]) == 2 and "give --out DIR" in capsys.readouterr().err


def test_make_data_says_what_it_wrote(tmp_path, capsys):
    out = tmp_path / "syn"
    argv = ["make-data", "synthetic", "--out", str(out), "--images", "40", "--val-images", "8"]
    assert main([*argv, "--test-images", "12", "--captions-per-image", "3"]) == 0
    shown = capsys.readouterr().out
    assert f"wrote dataset {out} in " in shown
    for split, images in (("train", 40), ("val", 8), ("test", 12)):
        assert f"{split}{images:>9,} images{3 * images:>9,} captions".replace(" ", "") in shown.replace(
            " ", ""
        )
    assert main(["data", "summary", str(out)]) == 0 and "task pairs" in capsys.readouterr().out
