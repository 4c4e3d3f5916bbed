"""Sweeps (raydist/tune/sweep.py): the resource check, the results table, and real
sweeps of the `tiny` preset on the session's 4-CPU Ray: a trial that fails is reported as ERROR while
the sweep goes on, the best config is a preset `raydist train` accepts, and `--resume` re-runs it."""

import contextlib
import io
from pathlib import Path

import pytest
import yaml

from raydist.checkpoint import has_state
from raydist.cli import main
from raydist.config import ConfigError, load_config
from raydist.runtime import cluster_capacity
from raydist.tasks import DataInfo
from raydist.train.trainer import run_training
from raydist.tune.space import parse_space, resolve_base_config, trial_config
from raydist.tune.sweep import (
    SweepOutcome,
    TrialRow,
    check_sweep_fits,
    format_results,
    resume_sweep,
    run_sweep,
    sweep_cpus,
    trial_epochs,
    trial_resources,
)

MARGIN = str(Path(__file__).resolve().parents[1] / "tune_spaces" / "margin.yaml")
# One trial at a time: 1 × (0.5 driver + 1 worker × 0.5 + 1 Ray Data) = 2 of the session's 4 CPUs. Each
# trial is a Ray Train run with a worker group (one worker: what is tested is Tune's handling of the runs;
# 2-worker Train runs inside Tune trials are `raydist experiment gather --quick`'s in tests/test_experiments.py).
# ASHA's max_t=1 stops every trial after the first of its 2 epochs: a stopped trial's Train run is
# killed mid-run, and the next trial starts only if that run's placement group was freed.
FAILING_SPACE = {
    "search": "random",
    "num_samples": 1,
    "max_concurrent_trials": 1,
    "scheduler": {"type": "asha", "max_t": 1, "grace_period": 1},
    "resources": {"trial_cpus": 0.5, "num_workers": 1, "cpus_per_worker": 0.5},
    "base": {"train.epochs": 2, "train.log_every": 1000},
    # Trial order follows the grid: the first trial's rank 0 exits hard at its first step
    # (fault injection, once per run folder), the second trains until ASHA stops it.
    "space": {"debug.fail_at_step": {"grid": [0, -1]}, "loss.margin": {"uniform": [0.1, 0.3]}},
}


def test_optuna_missing_is_a_clear_error(monkeypatch, tiny_dataset):
    import importlib.util

    space = parse_space({"search": "optuna", "space": {"loss.margin": {"uniform": [0.1, 0.2]}}}, name="o")
    cfg = resolve_base_config(space, preset="tiny", overrides={"data.path": str(tiny_dataset)})
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ConfigError, match="optuna is not installed.*pip install"):
        run_sweep(space, cfg)


def test_too_little_data_for_the_largest_negative_set_is_refused(tiny_dataset):
    space = parse_space({"space": {"loss.negative_set_size": {"choice": [8, 4096]}}}, name="n")
    cfg = resolve_base_config(space, preset="tiny", overrides={"data.path": str(tiny_dataset)})
    with pytest.raises(ValueError, match="has 2000 rows, fewer than one global batch of 4096"):
        run_sweep(space, cfg)


def test_trials_schedule_by_steps_like_train(tiny_dataset):
    """Tune trials resolve train.min_steps as `raydist train` does, per trial (a bigger swept batch has fewer
    steps per epoch, so more epochs), and ASHA's max_t covers the longest trial."""
    from raydist.tune.sweep import _scheduler

    space = parse_space({"space": {"train.batch_size": {"grid": [16, 64]}}}, name="steps")
    cfg = resolve_base_config(
        space, preset="tiny", overrides={"data.path": str(tiny_dataset), "train.min_steps": 400}
    )
    rows = 2000  # tiny_dataset: 400 images × 5 captions; the tiny preset cuts epochs at train.epoch_steps
    per_epoch = {b: min(rows // b, cfg.train.epoch_steps or rows) for b in (16, 64)}
    expected = {b: max(cfg.train.epochs, -(-400 // per_epoch[b])) for b in (16, 64)}
    assert expected[64] > expected[16] > cfg.train.epochs  # 13 vs 7 epochs; the preset runs 3
    for batch, epochs in expected.items():
        assert trial_epochs(cfg, {"train.batch_size": batch}, DataInfo.from_dataset(tiny_dataset)) == epochs
    assert trial_epochs(cfg, {"train.batch_size": 64}, None) == cfg.train.epochs
    assert _scheduler(space, cfg, DataInfo.from_dataset(tiny_dataset))._max_t == expected[64]


@pytest.mark.slow
def test_a_sweep_that_cannot_fit_is_refused(ray_cluster):
    space = parse_space(
        {
            "max_concurrent_trials": 2,
            "resources": {"trial_cpus": 1},
            "space": {"loss.margin": {"choice": [0.1]}},
        },
        name="big",
    )
    cfg = resolve_base_config(space, preset="tiny")
    assert sweep_cpus(space, cfg) == 2 * (1 + 2 * 0.5 + 1)
    with pytest.raises(ConfigError, match=r"needs 6 logical CPUs = max_concurrent_trials 2 .* cluster has 4"):
        check_sweep_fits(space, cfg, cluster_capacity())


def test_a_trial_that_never_ran_has_no_values_instead_of_breaking_the_table(tmp_path):
    """A trial whose actor never started (its node went away first) has neither a config in its result nor a
    params.json: its row gets no swept values; one that reported keeps them; a params.json is read."""
    from types import SimpleNamespace

    from raydist.tune.sweep import _trial_values

    space = parse_space(yaml.safe_load(Path(MARGIN).read_text()), "margin")
    never = SimpleNamespace(config={}, path=str(tmp_path / "trial_0"))
    assert _trial_values(never, space) == {}
    (tmp_path / "trial_1").mkdir()
    (tmp_path / "trial_1" / "params.json").write_text('{"loss.margin": 0.3, "train.epochs": 4}')
    assert _trial_values(SimpleNamespace(config={}, path=str(tmp_path / "trial_1")), space) == {
        "loss.margin": 0.3
    }
    reported = SimpleNamespace(config={"loss.margin": 0.2}, path=str(tmp_path / "nowhere"))
    assert _trial_values(reported, space) == {"loss.margin": 0.2}


def test_results_table():
    outcome = SweepOutcome(
        experiment_path="/x",
        metric="val/rsum",
        keys=["loss.margin", "loss.negative_set_size"],
        rows=[
            TrialRow(
                "trial_a",
                {"loss.margin": 0.123456, "loss.negative_set_size": None},
                301.5,
                3,
                "TERMINATED",
                note="all epochs",
            ),
            TrialRow(
                "trial_b",
                {"loss.margin": 0.3, "loss.negative_set_size": 8},
                None,
                0,
                "ERROR",
                "RuntimeError: x",
            ),
        ],
        best_trial="trial_a",
        best_config_path="/x/best_config.yaml",
        best_checkpoint=None,
    )
    lines = format_results(outcome).splitlines()
    assert lines[0].split() == [
        "trial",
        "loss.margin",
        "loss.negative_set_size",
        "val/rsum",
        "epochs",
        "status",
        "ended",
    ]
    assert lines[1].split() == [
        "trial_a",
        "0.1235",
        "None",
        "301.5",
        "3",
        "TERMINATED",
        "all",
        "epochs",
        "<-",
        "best",
    ]
    assert lines[2].split() == ["trial_b", "0.3", "8", "-", "0", "ERROR", "-"]
    assert lines[3] == "trial_b failed: RuntimeError: x"


@pytest.fixture(scope="module")
def failing_sweep(ray_cluster, tiny_dataset, tmp_path_factory):
    space = parse_space(FAILING_SPACE, name="failing")
    cfg = resolve_base_config(space, preset="tiny", overrides={"data.path": str(tiny_dataset)})
    console = io.StringIO()  # what the user's console shows of the sweep (capsys is per test)
    with contextlib.redirect_stdout(console):
        outcome = run_sweep(space, cfg, storage_path=str(tmp_path_factory.mktemp("tune")))
    return cfg, outcome, console.getvalue()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_failed_trial_is_reported_and_the_sweep_goes_on(failing_sweep, capsys):
    cfg, outcome, console = failing_sweep
    rows = {r.values["debug.fail_at_step"]: r for r in outcome.rows}
    assert set(rows) == {0, -1}
    failed, ok = rows[0], rows[-1]
    assert failed.status == "ERROR" and failed.error and failed.metric is None
    assert ok.status == "TERMINATED" and ok.note.startswith("stopped early at epoch 1")
    assert ok.epochs == 1 and ok.metric is not None and ok.metric > 0
    assert 0.1 <= ok.values["loss.margin"] <= 0.3
    table = format_results(outcome)
    assert "ERROR" in table and "stopped early" in table and f"{failed.trial} failed:" in table
    assert outcome.best_trial == ok.trial
    assert outcome.best_checkpoint and outcome.best_checkpoint.startswith(outcome.experiment_path)

    # The console: our lines only (Tune's trial table needs -v), one line per trial start and end.
    lines = [line for line in console.splitlines() if line.strip()]
    assert lines and all(line.startswith("[raydist] ") for line in lines), [
        line for line in lines if not line.startswith("[raydist] ")
    ][:5]
    assert "Trial status" not in console and "╭" not in console
    for row in (failed, ok):
        values = f"debug.fail_at_step={row.values['debug.fail_at_step']} loss.margin={row.values['loss.margin']:.4g}"
        assert [line for line in lines if line.startswith(f"[raydist] trial {row.trial} started:")] == [
            f"[raydist] trial {row.trial} started: {values}"
        ]
    (ended,) = [line for line in lines if line.startswith(f"[raydist] trial {ok.trial} finished:")]
    assert ended.endswith(f", 1 epochs, val/rsum {ok.metric:.4g} (best {ok.metric:.4g})")
    (error,) = [line for line in lines if line.startswith(f"[raydist] trial {failed.trial} failed:")]
    assert len(error) > len(f"[raydist] trial {failed.trial} failed: ")
    assert "traceback: " in error and ": error (" not in error  # the error's own line, and where the rest is

    best = load_config(preset_file=outcome.best_config_path)
    assert best.loss.margin == pytest.approx(ok.values["loss.margin"])
    assert (best.debug.fail_at_step, best.train.epochs, best.model.embed_dim) == (-1, 2, cfg.model.embed_dim)
    assert main(["train", "--preset-file", outcome.best_config_path, "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["loss"]["margin"] == pytest.approx(
        ok.values["loss.margin"]
    )


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_resume_reruns_the_errored_trial(failing_sweep):
    _, first, _ = failing_sweep
    failed = next(r for r in first.rows if r.status == "ERROR")
    outcome = resume_sweep(first.experiment_path, resume_errored=True)
    rerun = next(r for r in outcome.rows if r.trial == failed.trial)
    # The fault is injected once per run folder: the re-run trains until ASHA stops it.
    assert rerun.status == "TERMINATED" and rerun.epochs == 1
    assert {r.status for r in outcome.rows} == {"TERMINATED"}


def test_cli_refuses_bad_invocations(capsys, tmp_path):
    assert main(["tune"]) == 2
    assert "give a space file" in capsys.readouterr().err
    assert main(["tune", "--resume", str(tmp_path), MARGIN]) == 2
    assert "drop the other arguments" in capsys.readouterr().err
    assert main(["tune", MARGIN, "loss.margin=0.1"]) == 2
    assert "sweeps loss.margin" in capsys.readouterr().err
    assert main(["tune", MARGIN, "train.batch_size=33"]) == 2
    assert "must divide evenly" in capsys.readouterr().err
    assert main(["tune", "--resume", str(tmp_path)]) == 2
    assert "not a raydist sweep folder" in capsys.readouterr().err
    assert main(["tune", "nope"]) == 2
    assert "no shipped space of that name; shipped spaces: gather," in capsys.readouterr().err


# Two trials in process (train.num_workers=0): each trains in its Tune actor, no Ray Train worker group.
IN_PROCESS_SPACE = {
    "search": "grid",
    "scheduler": {"type": "fifo"},
    "max_concurrent_trials": 2,
    "resources": {"trial_cpus": 0.5, "num_workers": 0, "cpus_per_worker": 1},
    "base": {"train.epochs": 2, "train.log_every": 1000},
    "space": {"loss.margin": {"grid": [0.1, 0.3]}},
}


def test_in_process_trials_hold_their_training_cpu_and_refuse_remote_storage(tiny_dataset):
    space = parse_space(IN_PROCESS_SPACE, name="inproc")
    cfg = resolve_base_config(space, preset="tiny", overrides={"data.path": str(tiny_dataset)})
    assert trial_resources(0.5, cfg.to_dict(), {"loss.margin": 0.1}) == {"cpu": 1.5}
    assert trial_resources(0.5, cfg.to_dict(), {"train.num_workers": 2}) == {"cpu": 0.5}
    on_gpu = resolve_base_config(
        space, preset="tiny", overrides={"data.path": str(tiny_dataset), "train.use_gpu": True}
    )
    assert trial_resources(0.5, on_gpu.to_dict(), {}) == {"cpu": 1.5, "gpu": 1}
    assert sweep_cpus(space, cfg) == 2 * (0.5 + 1)  # no Ray Data CPU: the in-process run reads into memory
    with pytest.raises(ConfigError, match="train.num_workers=0 train in their Tune actor"):
        run_sweep(space, cfg, storage_path="s3://bucket/sweeps")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_in_process_trials_report_what_a_plain_in_process_run_trains(ray_cluster, small_pairs, tmp_path):
    """Each trial's per-epoch metrics and its best checkpoint are those of ``raydist train`` run in process with
    the trial's values: the trial forwards the loop's own reports (same seed, same data order). On 400 rows:
    the claim holds on any data, and the four in-process runs cost a fifth of what they do on 2000."""
    space = parse_space(IN_PROCESS_SPACE, name="inproc")
    cfg = resolve_base_config(space, preset="tiny", overrides={"data.path": str(small_pairs)})
    outcome = run_sweep(space, cfg, storage_path=str(tmp_path / "tune"))
    assert {r.status for r in outcome.rows} == {"TERMINATED"} and {r.epochs for r in outcome.rows} == {2}
    for row in outcome.rows:
        plain = run_training(
            trial_config(
                cfg,
                {**row.values, "train.storage_path": str(tmp_path / "plain"), "train.run_name": row.trial},
            ),
            evaluate_test=False,
        )
        best = max(m["val/rsum"] for m in plain.history)
        assert row.metric == pytest.approx(best, rel=1e-6, abs=1e-6), (row, plain.history)
    best_row = max(outcome.rows, key=lambda r: r.metric)
    assert outcome.best_trial == best_row.trial
    folder = Path(outcome.experiment_path) / best_row.trial / "train"
    assert Path(outcome.best_checkpoint).parent == folder and has_state(outcome.best_checkpoint)
