"""The training loop without Ray (raydist.train.local.LocalRuntime): learning, checkpoints, exact resume,
hooks and the state registry; and that the loop module imports no Ray."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from raydist.checkpoint import load_checkpoint
from raydist.config import load_config
from raydist.tasks import DataInfo, build_task
from raydist.train.hooks import Hook, ValidationHook
from raydist.train.local import LocalRuntime
from raydist.train.loop import run_loop
from raydist.train.plan import step_plan


def _setup(data_dir, run_dir, **overrides):
    cfg = load_config("tiny", overrides={"data.path": str(data_dir), "train.num_workers": 1, **overrides})
    task = build_task(cfg, DataInfo.from_dataset(data_dir))
    plan = step_plan(cfg, task.info.task)
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
    cfg, task, plan, runtime = _setup(
        tiny_dataset, tmp_path, **{"train.epochs": 5, "train.lr": 1e-12, "train.early_stop_patience": 1}
    )
    out = run_loop(cfg, task, runtime, plan, hooks=[ValidationHook(task)])
    assert [m["epoch"] for m in out["history"]] == [1, 2]  # epoch 2 did not beat epoch 1


def test_schedule_by_steps(tiny_dataset):
    from raydist.train.plan import resolve_schedule

    cfg = load_config(
        "tiny",
        overrides={"data.path": str(tiny_dataset), "train.min_steps": 500, "loss.warmup_sh_steps": 100},
    )
    resolved, note = resolve_schedule(cfg, DataInfo.from_dataset(tiny_dataset))
    steps = 2000 // cfg.train.batch_size  # 400 images × 5 captions
    assert resolved.train.epochs == -(-500 // steps) and resolved.loss.warmup_sh_epochs == -(-100 // steps)
    assert f"{resolved.train.epochs} epochs × {steps} steps" in note and "train.min_steps=500" in note
    assert (
        resolve_schedule(load_config("tiny"), DataInfo.from_dataset(tiny_dataset))[0].train.epochs
        == load_config("tiny").train.epochs
    )


def test_raised_epochs_scale_the_lr_decay_epoch(tiny_dataset):
    """The LR drops at the same fraction of the run when train.min_steps raises the epochs (4 of 5 epochs
    → 4·E′/5 of E′), and a decay that never happens in the configured run stays off."""
    from raydist.train.plan import resolve_schedule

    steps = 2000 // 128  # tiny_dataset: 400 images × 5 captions, batch 128 → 15 steps per epoch
    cfg = load_config(
        "tiny",
        overrides={
            "data.path": str(tiny_dataset),
            "train.batch_size": 128,
            "train.epochs": 5,
            "train.lr_decay_epoch": 4,
            "train.min_steps": 40 * steps,
        },
    )
    resolved, note = resolve_schedule(cfg, DataInfo.from_dataset(tiny_dataset))
    assert resolved.train.epochs == 40 and resolved.train.lr_decay_epoch == 32  # 4 · 40 / 5
    assert "LR decay at epoch 32, scaled from train.lr_decay_epoch=4" in note
    plain, _ = resolve_schedule(
        cfg.model_copy(update={"train": cfg.train.model_copy(update={"min_steps": 0})}),
        DataInfo.from_dataset(tiny_dataset),
    )
    assert (plain.train.epochs, plain.train.lr_decay_epoch) == (5, 4)
    # the fine-tuning switch too: frozen 2 of 5 epochs → 16 of 40 (an image encoder has a backbone to freeze)
    frozen = load_config(
        "tiny",
        overrides={
            "data.path": str(tiny_dataset),
            "train.batch_size": 128,
            "train.epochs": 5,
            "train.freeze_backbone_epochs": 2,
            "model.image_encoder": "small-cnn",
            "train.min_steps": 40 * steps,
        },
    )
    resolved, note = resolve_schedule(frozen, DataInfo.from_dataset(tiny_dataset))
    assert (resolved.train.epochs, resolved.train.freeze_backbone_epochs) == (40, 16)
    assert "backbone frozen 16 epochs, scaled from train.freeze_backbone_epochs=2" in note


def test_stalled_mh_is_detected_and_falls_back_to_sh(tiny_dataset):
    cfg = load_config("tiny", overrides={"data.path": str(tiny_dataset)})
    task = build_task(cfg, DataInfo.from_dataset(tiny_dataset))
    collapse = 2 * cfg.train.batch_size * cfg.loss.margin
    assert task.hardest(1) and task.end_epoch(1, {"train/loss": collapse * 1.3}) == []
    notes = task.end_epoch(1, {"train/loss": collapse * 1.002})
    assert len(notes) == 1 and "collapse value" in notes[0]
    assert not task.hardest(2) and task.hardest(3)  # one SH epoch, then MH again
    assert task.end_epoch(0, {"train/loss": collapse}) == []  # epoch 0 is SH warm-up: not a stalled MH


def _labels_config(data_dir, **overrides):
    from raydist.data import dataset_task

    return load_config("default", overrides={"data.path": str(data_dir), **overrides}, task_of=dataset_task)


def test_labels_schedule_has_no_sh_warmup_and_no_pairs_min_steps(labels_dataset, tiny_dataset):
    from raydist.train.plan import resolve_schedule

    cfg = _labels_config(labels_dataset)
    resolved, note = resolve_schedule(cfg, DataInfo.from_dataset(labels_dataset))
    assert (resolved.train.epochs, resolved.loss.warmup_sh_epochs) == (cfg.train.epochs, 0)
    assert "SH warm-up" not in note and "raised" not in note and resolved.train.early_stop_patience == 0
    # the same preset on image–caption data keeps its step-based schedule and warm-up
    pairs = _labels_config(tiny_dataset)
    steps = 2000 // pairs.train.batch_size  # tiny_dataset: 400 images × 5 captions
    resolved, note = resolve_schedule(pairs, DataInfo.from_dataset(tiny_dataset))
    assert resolved.train.epochs == -(-pairs.train.min_steps // steps) and "SH warm-up" in note


def test_label_noise_turns_early_stopping_on_by_default(labels_dataset):
    from raydist.tasks import LabelsTask
    from raydist.train.plan import resolve_schedule

    resolved, note = resolve_schedule(
        _labels_config(labels_dataset, **{"data.label_noise": 0.2}), DataInfo.from_dataset(labels_dataset)
    )
    assert resolved.train.early_stop_patience == LabelsTask.noisy_label_patience > 0 and "early stop" in note
    for explicit in (0, 7):  # a value the user gives wins
        cfg = _labels_config(
            labels_dataset, **{"data.label_noise": 0.2, "train.early_stop_patience": explicit}
        )
        assert (
            resolve_schedule(cfg, DataInfo.from_dataset(labels_dataset))[0].train.early_stop_patience
            == explicit
        )


def test_epochs_without_improvement_counts_from_the_first_best():
    from raydist.train.loop import epochs_without_improvement

    rng = torch.Generator().manual_seed(0)
    for _ in range(200):
        scores = torch.randint(
            0, 5, (int(torch.randint(1, 12, (1,), generator=rng)),), generator=rng
        ).tolist()
        stale, best = 0, float("-inf")  # running count: reset on a strictly better score
        for s in scores:
            stale, best = (0, s) if s > best else (stale + 1, best)
        assert epochs_without_improvement(scores) == stale, scores
    assert epochs_without_improvement([]) == 0


def test_noisy_labels_stop_early_in_process(labels_dataset, tmp_path):
    """Label noise, no patience given: the resolved default stops a run whose val metric never improves
    (a learning rate too small to change it) after that many epochs."""
    from raydist.train.plan import resolve_schedule, step_plan

    cfg = _labels_config(
        labels_dataset,
        **{
            "data.label_noise": 0.2,
            "train.lr": 1e-12,
            "train.epochs": 8,
            "train.num_workers": 1,
            "train.batch_size": 64,
        },
    )
    cfg, _ = resolve_schedule(cfg, DataInfo.from_dataset(labels_dataset))
    task = build_task(cfg, DataInfo.from_dataset(labels_dataset))
    plan = step_plan(cfg, task.info.task)
    out = run_loop(cfg, task, LocalRuntime(cfg, task, plan, tmp_path), plan, hooks=[ValidationHook(task)])
    assert [m["epoch"] for m in out["history"]] == list(range(1, cfg.train.early_stop_patience + 2))


def test_reported_training_loss_leaves_out_the_probe(labels_dataset, tmp_path):
    """Triplet loss: the head is a linear probe trained alongside; the step reports the triplet loss, and
    the probe's cross-entropy (computed here from the model's own logits) apart."""
    import torch.nn.functional as F

    from raydist.distributed import gather_step, step_generator
    from raydist.tasks import StepContext, to_tensors
    from raydist.tasks.base import PROBE_LOSS
    from raydist.train.loop import Trainables, train_step

    cfg = _labels_config(
        labels_dataset, **{"loss.kind": "triplet", "train.num_workers": 1, "train.batch_size": 64}
    )
    task = build_task(cfg, DataInfo.from_dataset(labels_dataset))
    plan, ctx = step_plan(cfg, task.info.task), StepContext(0, 0, 0, 1)
    torch.manual_seed(0)
    parts = Trainables.build(cfg, task.build_model(), torch.device("cpu"))
    batch = next(iter(LocalRuntime(cfg, task, plan, tmp_path).train_batches(0)))
    tensors = to_tensors(batch, "cpu")
    with torch.no_grad():  # the probe's loss and the whole loss the step backpropagates, before the step
        probe = float(F.cross_entropy(parts.model(tensors["image"], probe=True)[1], tensors["label"]))
        encoded = task.encode(parts.model, tensors)
        draw = plan.draw(0, step_generator(cfg.train.seed, 0))
        total = float(task.loss(encoded, gather_step(encoded.embeddings, encoded.ids), draw, ctx, {}))
    stats: dict[str, float] = {}
    reported = train_step(parts, task, batch, cfg, plan, ctx, torch.device("cpu"), stats)
    assert stats[PROBE_LOSS] == pytest.approx(probe, rel=1e-5)
    assert reported == pytest.approx(total - probe, rel=1e-5, abs=1e-6) and reported != pytest.approx(total)


def test_epoch_steps_cuts_every_epoch_and_each_draws_a_fresh_shuffle(tiny_dataset, tmp_path):
    """train.epoch_steps=5 over 2 epochs: 5 optimizer steps each (counted by a hook), the schedule line says so,
    and the two epochs' batches are different rows (each epoch a fresh shuffle, not the same first 5 batches)."""
    from raydist.train.plan import resolve_schedule

    cfg, task, plan, runtime = _setup(tiny_dataset, tmp_path, **{"train.epochs": 2, "train.epoch_steps": 5})
    full = 2000 // cfg.train.batch_size
    note = resolve_schedule(cfg, DataInfo.from_dataset(tiny_dataset))[1]
    assert f"2 epochs × 5 steps = 10 steps (epochs cut from {full} steps by train.epoch_steps=5)" in note
    seen: list[list[int]] = [[], []]

    class Rows(Hook):
        def wrap_batches(self, epoch, batches):
            for batch in batches:
                seen[epoch].extend(int(i) for i in batch["sample_id"])
                yield batch

    hook = GradientNorms()
    out = run_loop(cfg, task, runtime, plan, hooks=[hook, Rows()])
    assert hook.count == out["global_step"] == 10
    assert [m["step"] for m in out["history"]] == [5, 10]
    assert len(seen[0]) >= 5 * cfg.train.batch_size and seen[0][:160] != seen[1][:160]


def test_the_tiny_preset_is_the_quickest_run_and_presets_say_their_steps(capsys):
    from raydist.cli import main
    from raydist.data import ensure_default_dataset
    from raydist.presets.table import schedule_of

    embedded = ensure_default_dataset()

    def steps(name: str) -> int:
        return int(schedule_of(name, embedded).split(" = ")[1].split(" steps")[0])

    assert steps("tiny") <= 3 * 64 < steps("default") <= steps("small")
    assert main(["presets"]) == 0
    shown = capsys.readouterr().out
    assert "tiny: The quickest real run" in shown and f"= {steps('tiny')} steps" in shown
    assert "vsepp-finetune" in shown and "not for this dataset: model.image_encoder=torchvision" in shown
    assert shown.count("time:") >= 2  # tiny and default state their measured time
