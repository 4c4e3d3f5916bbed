"""Gradient clustering inside training (in-process runs, labels task): statistics and the variance meter in
the history, GC-stratified batches with weights, GC state in checkpoints and restored on resume."""

from __future__ import annotations

import pytest
import torch

from raydist.checkpoint import load_checkpoint
from raydist.config import load_config
from raydist.tasks import DataInfo, build_task
from raydist.train.gradclust_hook import GradientClusteringHook
from raydist.train.local import LocalRuntime
from raydist.train.loop import run_loop
from raydist.train.plan import step_plan
from raydist.train.wiring import build_hooks


def _run(data, run_dir, resume_from=None, **overrides):
    cfg = load_config(
        "tiny",
        overrides={
            "data.path": str(data),
            "train.num_workers": 1,
            "gc.num_clusters": 4,
            "gc.log_every": 5,
            "gc.variance_batches": 3,
            **overrides,
        },
    )
    task = build_task(cfg, DataInfo.from_dataset(data))
    plan = step_plan(cfg, task.info.task)
    runtime = LocalRuntime(cfg, task, plan, run_dir)
    hooks = build_hooks(cfg, task, runtime, str(run_dir))
    out = run_loop(cfg, task, runtime, plan, hooks=hooks, resume_from=resume_from)
    return out, runtime, next(h for h in hooks if isinstance(h, GradientClusteringHook))


@pytest.mark.timeout(240)
def test_measure_reports_variance_and_resume_keeps_the_clusters(labels_dataset, tmp_path):
    out, runtime, hook = _run(labels_dataset, tmp_path / "a", **{"gc.measure": True, "train.epochs": 1})
    last = out["history"][-1]
    for key in ("gvar/sgd_var", "gvar/sgd_nvar", "gvar/gc_var", "gvar/gc_nvar", "gc/distortion"):
        assert key in last and last[key] >= 0
    saved = load_checkpoint(runtime.checkpoints[-1])[0]["gradclust"]
    final = hook.gc.state_dict()
    assert saved["centres"].keys() == final["centres"].keys() and len(saved["assignments"]["sample_ids"]) > 0
    # resume: the restored clustering holds the saved centres, counts and assignments
    _, _, again = _run(
        labels_dataset,
        tmp_path / "b",
        resume_from=str(runtime.checkpoints[-1]),
        **{"gc.measure": True, "train.epochs": 1},
    )
    restored = again.gc.state_dict()
    for name, centre in saved["centres"].items():
        for part in ("d", "c"):
            torch.testing.assert_close(restored["centres"][name][part], centre[part])
    torch.testing.assert_close(restored["counts"], saved["counts"])
    assert torch.equal(restored["assignments"]["clusters"], saved["assignments"]["clusters"])


@pytest.mark.timeout(240)
def test_sample_trains_on_stratified_weighted_batches(labels_dataset, tmp_path):
    out, _, hook = _run(labels_dataset, tmp_path, **{"gc.sample": True, "train.epochs": 2})
    assert out["history"][-1]["val/top1"] > 30  # 10 classes: chance 10 %
    batch = next(iter(hook._stratified(1)))
    assert "weight" in batch and len(batch["weight"]) == hook.rows
    # Σ_i w_i / B = 1 (the weights keep the mean-loss estimator unbiased for a constant loss)
    assert float(batch["weight"].sum()) / hook.rows == pytest.approx(1.0, rel=1e-5)


@pytest.mark.timeout(240)
def test_metric_loss_samples_by_row_contributions_and_meters_the_variance(labels_dataset, tmp_path, capsys):
    """Triplet loss (not a sum over rows): gc.sample runs as the documented heuristic, the reassignment pass
    assigns every row of the shard, and the variance meter reports both estimators."""
    out, _, hook = _run(
        labels_dataset, tmp_path, **{"gc.sample": True, "loss.kind": "triplet", "train.epochs": 2}
    )
    assert "heuristic" in capsys.readouterr().out
    last = out["history"][-1]
    for key in ("gvar/sgd_var", "gvar/sgd_nvar", "gvar/gc_var", "gvar/gc_nvar"):
        assert last[key] > 0
    chunks = len(hook.shard_ids) // hook.rows * hook.rows
    clusters = hook.gc.assignments(hook.shard_ids[:chunks])
    assert (clusters >= 0).all() and len(set(clusters.tolist())) > 1


@pytest.mark.timeout(240)
def test_pairs_ranking_loss_gets_reassignment_and_the_variance_meter(small_pairs, tmp_path):
    """The pairs task (VSE++ ranking loss, per-row contributions): gc.measure with a reassignment pass each
    epoch and the meter every few steps (steps 5 and 10 of 12)."""
    out, _, hook = _run(
        small_pairs, tmp_path, **{"gc.measure": True, "gc.reassign_every": 1, "train.epochs": 1}
    )
    last = out["history"][-1]
    for key in ("gvar/sgd_var", "gvar/sgd_nvar", "gvar/gc_var", "gvar/gc_nvar", "gc/distortion"):
        assert key in last and last[key] > 0
    chunks = len(hook.shard_ids) // hook.rows * hook.rows
    assert (hook.gc.assignments(hook.shard_ids[:chunks]) >= 0).all()


def test_plot_shows_the_variance_over_training(labels_dataset, tmp_path):
    import json

    from raydist.plots import plot_run

    out, _, _ = _run(labels_dataset, tmp_path, **{"gc.measure": True, "train.epochs": 1})
    (tmp_path / "history.json").write_text(json.dumps(out["history"]))
    files = plot_run(tmp_path)
    assert any(f.name == "gradient_variance.png" and f.stat().st_size > 1000 for f in files)


@pytest.mark.timeout(240)
def test_stats_every_feeds_only_every_kth_step(labels_dataset, tmp_path, monkeypatch):
    """gc.stats_every=3: the training steps 0, 3, 6, ... are captured and assigned, the others run the model
    untouched; every step's batch is recorded beside GC (by the loop's own forward) to check which rows GC
    saw; the U-step cadence counts statistics steps; the variance meter still runs every gc.log_every steps."""
    from raydist.gradclust import GradientClustering

    seen: list[torch.Tensor] = []  # every training step's sample ids, in order
    fed: list[torch.Tensor] = []  # the ids GC's A-step received
    captures = []
    original_after, original_capture = GradientClustering.after_backward, GradientClustering.capture
    original_hook_after = GradientClusteringHook.after_backward

    def hook_after(self, ctx, model):
        seen.append(ctx.batch["sample_id"].cpu().clone())
        return original_hook_after(self, ctx, model)

    def after(self, sample_ids=None, **kwargs):
        fed.append(sample_ids.clone())
        return original_after(self, sample_ids, **kwargs)

    def capture(self):
        captures.append(len(seen))
        return original_capture(self)

    monkeypatch.setattr(GradientClusteringHook, "after_backward", hook_after)
    monkeypatch.setattr(GradientClustering, "after_backward", after)
    monkeypatch.setattr(GradientClustering, "capture", capture)
    out, _, hook = _run(
        labels_dataset,
        tmp_path,
        **{"gc.measure": True, "gc.stats_every": 3, "gc.update_every": 2, "gc.reassign_every": 0},
        **{"train.epochs": 1},
    )
    steps = len(seen)
    assert steps >= 9
    expected = [seen[s] for s in range(0, steps, 3)]
    assert captures == list(range(0, steps, 3))  # captured forward passes: exactly the statistics steps
    assert len(fed) == len(expected) and all(torch.equal(a, b) for a, b in zip(fed, expected, strict=True))
    assert hook.gc.steps == len(expected) and hook.gc.updates == len(expected) // 2
    everyone = torch.cat(seen).unique()
    assigned = set(everyone[hook.gc.assignments(everyone) >= 0].tolist())
    assert assigned == set(torch.cat(expected).tolist())  # no row of a skipped step was assigned
    assert "gvar/gc_var" in out["history"][-1]
