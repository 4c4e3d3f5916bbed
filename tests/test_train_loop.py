"""The training loop without Ray (raydist.train.local.LocalRuntime): learning, checkpoints, exact resume,
hooks and the state registry; and that the loop module imports no Ray."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from raydist.checkpoint import load_checkpoint
from raydist.config import load_config
from raydist.distributed import StepPlan
from raydist.tasks import DataInfo, build_task
from raydist.train.hooks import Hook, ValidationHook
from raydist.train.local import LocalRuntime
from raydist.train.loop import run_loop


def _setup(data_dir, run_dir, **overrides):
    cfg = load_config("tiny", overrides={"data.path": str(data_dir), "train.num_workers": 1, **overrides})
    task = build_task(cfg, DataInfo.from_dataset(data_dir))
    plan = StepPlan.from_config(cfg)
    return cfg, task, plan, LocalRuntime(cfg, task, plan, run_dir)


def _params(folder) -> dict[str, torch.Tensor]:
    return load_checkpoint(folder)[0]["model"]


def test_loop_learns_and_checkpoints_without_ray(tiny_dataset, tmp_path):
    cfg, task, plan, runtime = _setup(tiny_dataset, tmp_path, **{"train.epochs": 2})
    torch.manual_seed(cfg.train.seed)
    before = task.evaluate(task.build_model(), "val")["rsum"]
    out = run_loop(cfg, task, runtime, plan, hooks=[ValidationHook(task)])
    assert [m["epoch"] for m in out["history"]] == [1, 2]
    assert out["global_step"] == 2 * (2000 // cfg.train.batch_size)  # 400 images × 5 captions
    assert out["history"][-1]["val/rsum"] > before + 60
    assert len(runtime.checkpoints) == 2 and runtime.reports[-1]["val/rsum"] == out["history"][-1]["val/rsum"]


def test_resume_is_exact(tiny_dataset, tmp_path):
    """2 epochs straight = 1 epoch, then resume from its checkpoint for the second (same seed)."""
    cfg, task, plan, runtime = _setup(tiny_dataset, tmp_path / "a", **{"train.epochs": 2})
    run_loop(cfg, task, runtime, plan)
    cfg1, task1, plan1, first = _setup(tiny_dataset, tmp_path / "b", **{"train.epochs": 1})
    run_loop(cfg1, task1, first, plan1)
    cfg2, task2, plan2, second = _setup(tiny_dataset, tmp_path / "c", **{"train.epochs": 2})
    out = run_loop(cfg2, task2, second, plan2, resume_from=str(first.checkpoints[-1]))
    assert out["resumed_at"] == [first.reports[-1]["step"]]
    want, got = _params(runtime.checkpoints[-1]), _params(second.checkpoints[-1])
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-6)


class GradientNorms(Hook):
    """Records the gradient norm after every backward and keeps a counter as checkpointed state."""

    def __init__(self) -> None:
        self.norms: list[float] = []
        self.count = 0

    def setup(self, model, registry) -> None:
        registry.register("gradient_norms", self)

    def after_backward(self, ctx, model) -> None:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        self.norms.append(float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))))
        self.count += 1

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.count = state["count"]


def test_after_backward_hook_and_state_registry(tiny_dataset, tmp_path):
    cfg, task, plan, runtime = _setup(tiny_dataset, tmp_path / "a", **{"train.epochs": 1})
    hook = GradientNorms()
    out = run_loop(cfg, task, runtime, plan, hooks=[hook])
    assert hook.count == out["global_step"] and all(n > 0 for n in hook.norms)
    state = load_checkpoint(runtime.checkpoints[-1])[0]
    assert state["gradient_norms"] == {"count": hook.count}
    cfg2, task2, plan2, again = _setup(tiny_dataset, tmp_path / "b", **{"train.epochs": 2})
    resumed = GradientNorms()
    run_loop(cfg2, task2, again, plan2, hooks=[resumed], resume_from=str(runtime.checkpoints[-1]))
    assert resumed.count == 2 * hook.count  # restored, then counted on


def test_resume_refuses_another_task_or_dims(tiny_dataset, labels_dataset, tmp_path):
    cfg, task, plan, runtime = _setup(tiny_dataset, tmp_path / "a", **{"train.epochs": 1})
    run_loop(cfg, task, runtime, plan)
    cfg2, task2, plan2, other = _setup(labels_dataset, tmp_path / "b", **{"train.epochs": 1})
    with pytest.raises(ValueError, match="task: checkpoint='pairs' data='labels'"):
        run_loop(cfg2, task2, other, plan2, resume_from=str(runtime.checkpoints[-1]))


def test_loop_module_imports_no_ray():
    code = "import sys, raydist.train.loop, raydist.train.local; print(any(m.split('.')[0] == 'ray' for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_early_stopping_stops_every_rank_at_the_same_epoch(tiny_dataset, tmp_path):
    cfg, task, plan, runtime = _setup(tiny_dataset, tmp_path, **{"train.epochs": 5, "train.lr": 1e-12,
                                                                 "train.early_stop_patience": 1})  # fmt: skip
    out = run_loop(cfg, task, runtime, plan, hooks=[ValidationHook(task)])
    assert [m["epoch"] for m in out["history"]] == [1, 2]  # epoch 2 did not beat epoch 1


def test_schedule_by_steps(tiny_dataset):
    from raydist.train.trainer import resolve_schedule

    cfg = load_config("tiny", overrides={"data.path": str(tiny_dataset), "train.min_steps": 500,
                                         "loss.warmup_sh_steps": 100})  # fmt: skip
    resolved, note = resolve_schedule(cfg, tiny_dataset)
    steps = 2000 // cfg.train.batch_size  # 400 images × 5 captions
    assert resolved.train.epochs == -(-500 // steps) and resolved.loss.warmup_sh_epochs == -(-100 // steps)
    assert f"{resolved.train.epochs} epochs × {steps} steps" in note and "train.min_steps=500" in note
    assert resolve_schedule(load_config("tiny"), tiny_dataset)[0].train.epochs == load_config("tiny").train.epochs


def test_raised_epochs_scale_the_lr_decay_epoch(tiny_dataset):
    """The LR drops at the same fraction of the run when train.min_steps raises the epochs (4 of 5 epochs
    → 4·E′/5 of E′), and a decay that never happens in the configured run stays off."""
    from raydist.train.trainer import resolve_schedule

    steps = 2000 // 128  # tiny_dataset: 400 images × 5 captions, batch 128 → 15 steps per epoch
    cfg = load_config("tiny", overrides={"data.path": str(tiny_dataset), "train.batch_size": 128, "train.epochs": 5,
                                         "train.lr_decay_epoch": 4, "train.min_steps": 40 * steps})  # fmt: skip
    resolved, note = resolve_schedule(cfg, tiny_dataset)
    assert resolved.train.epochs == 40 and resolved.train.lr_decay_epoch == 32  # 4 · 40 / 5
    assert "LR decay at epoch 32, scaled from train.lr_decay_epoch=4" in note
    plain, _ = resolve_schedule(cfg.model_copy(update={"train": cfg.train.model_copy(update={"min_steps": 0})}),
                                tiny_dataset)  # fmt: skip
    assert (plain.train.epochs, plain.train.lr_decay_epoch) == (5, 4)


def test_stalled_mh_is_detected_and_falls_back_to_sh(tiny_dataset):
    cfg = load_config("tiny", overrides={"data.path": str(tiny_dataset)})
    task = build_task(cfg, DataInfo.from_dataset(tiny_dataset))
    collapse = 2 * cfg.train.batch_size * cfg.loss.margin
    assert task.hardest(1) and task.end_epoch(1, {"train/loss": collapse * 1.3}) == []
    notes = task.end_epoch(1, {"train/loss": collapse * 1.002})
    assert len(notes) == 1 and "collapse value" in notes[0]
    assert not task.hardest(2) and task.hardest(3)  # one SH epoch, then MH again
    assert task.end_epoch(0, {"train/loss": collapse}) == []  # epoch 0 is SH warm-up: not a stalled MH
