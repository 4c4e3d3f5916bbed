"""From a checkpoint to a model: choose the folder, load it, rebuild the task and its model, and check that the
data and the config fit the saved state. Evaluation, retrieval, indexes and resumed runs all start here."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from raydist.checkpoint import (
    ChosenCheckpoint,
    check_model_fits,
    choose_checkpoint,
    load_checkpoint,
    load_task_info,
    read_config,
    recorded_dataset,
)
from raydist.config import Config, ConfigError, apply_overrides, validate
from raydist.console import say
from raydist.data.schema import SPLITS
from raydist.distributed.spawn import spawn
from raydist.eval.retrieve import default_dims, retrieval_report
from raydist.retrieval.budget import IndexBudget, write_budget_index
from raydist.retrieval.index import build_indexes
from raydist.retrieval.sets import RetrievalSet, concat_sets
from raydist.tasks import DataInfo, Task, build_task

ALL_SPLITS = "all"  # a split name that means every split of the dataset (train, val and test, in that order)


def val_metric(folder: Path) -> str:
    """The val metric that ranks a run's checkpoints, ``val/<task.primary_metric>`` of the task the checkpoint
    ``folder`` builds (what :func:`raydist.checkpoint.choose_checkpoint` scores by)."""
    task = build_task(read_config(folder), DataInfo.from_checkpoint(folder, load_task_info(folder)))
    return f"val/{task.primary_metric}"


def choose_trained(path: str | Path, *, latest: bool = False) -> ChosenCheckpoint:
    """The checkpoint a checkpoint or run folder (or URI) means: :func:`raydist.checkpoint.choose_checkpoint`
    by the run's :func:`val_metric`, or with ``latest`` the run's newest."""
    return choose_checkpoint(path, val_metric, latest=latest)


@dataclass
class Trained:
    """A checkpoint's model, loaded (eval mode, on ``device``), with its task, config and data facts
    (``data_info.data_dir`` is the dataset it is used on)."""

    task: Task
    model: nn.Module
    config: Config
    data_info: DataInfo
    checkpoint_path: Path
    device: torch.device | str = "cpu"
    chosen: str = "the checkpoint given"  # why this checkpoint (ChosenCheckpoint.reason)

    def trained_dims(self) -> list[int] | None:
        """The prefix dims the model was trained at (``model.nesting`` and the full dim), None without nesting."""
        m = self.config.model
        return sorted({*m.nesting, m.embed_dim}) if m.nesting else None

    def retrieval_dims(self, dims: Sequence[int] | None = None) -> list[int]:
        """``dims`` when given, else :meth:`trained_dims`, else the powers of two below the embedding dim and
        the dim itself (:func:`raydist.eval.retrieve.default_dims`)."""
        if dims:
            return list(dims)
        return self.trained_dims() or default_dims(self.config.model.embed_dim)

    def embed(self, split: str) -> RetrievalSet:
        """``split`` embedded by the task (:meth:`raydist.tasks.Task.embed`), marked with this checkpoint;
        ``"all"`` embeds every split and joins them (:func:`raydist.retrieval.sets.concat_sets`)."""
        if self.data_info.data_dir is None:
            raise ConfigError(
                f"checkpoint {self.checkpoint_path}: no dataset to embed {split!r} from; give --data DIR"
            )
        splits = list(SPLITS) if split == ALL_SPLITS else [split]
        if split != ALL_SPLITS and split not in SPLITS:
            raise ValueError(f"split {split!r}: expected one of {', '.join(SPLITS)} or {ALL_SPLITS!r}")
        rset = concat_sets([self.task.embed(self.model, s, self.device) for s in splits])
        return replace(rset, source=str(self.checkpoint_path))

    def evaluate(self, split: str) -> dict[str, float]:
        """The task's metrics of the model on ``split``."""
        return self.task.evaluate(self.model, split, self.device)


def check_data_fits(saved: DataInfo, data: DataInfo, folder: str | Path) -> None:
    """Refuse data whose facts (task, feature dim, classes, vocabulary) differ from the checkpoint's; the
    ConfigError names both sides of each, e.g. ``feature_dim: checkpoint=128 data=64``."""
    problems = saved.mismatch(data)
    if problems:
        where = f"dataset {data.data_dir}" if data.data_dir else "this dataset"
        raise ConfigError(f"checkpoint {folder} does not fit {where}:\n  " + "\n  ".join(problems))


def load_trained(
    checkpoint: str | Path,
    data_dir: str | Path | None = None,
    *,
    overrides: dict[str, Any] | None = None,
    device: torch.device | str = "cpu",
    latest: bool = False,
    need_data: bool = True,
    data: DataInfo | None = None,
) -> Trained:
    """Load a checkpoint folder, or a run folder's best checkpoint (its newest with ``latest``;
    :func:`choose_trained`), for use on ``data_dir`` (default: the dataset it was trained on): its config
    with ``overrides`` (e.g. ``eval.folds``), its task and model with the saved weights. The data is checked
    against the checkpoint first (:func:`check_data_fits`); with ``need_data=False`` a checkpoint whose dataset
    is gone still loads (``data_info.data_dir`` None: new inputs only, no splits). ``data``: the facts of
    ``data_dir`` when read already (a run plan's: its manifest is not read again)."""
    chosen = choose_trained(checkpoint, latest=latest)
    state, cfg, folder = load_checkpoint(chosen.path)
    if overrides:
        cfg = apply_overrides(cfg, overrides)
        validate(cfg)
    recorded = load_task_info(folder).get("data_dir")
    if need_data or data_dir is not None or (recorded and Path(recorded).is_dir()):
        data_dir = recorded_dataset(folder, data_dir)
    saved = DataInfo.from_checkpoint(folder, load_task_info(folder), data_dir)
    if data_dir is not None:
        data = (
            data if data is not None and data.data_dir == Path(data_dir) else DataInfo.from_dataset(data_dir)
        )
        check_data_fits(saved, data, folder)
        saved = replace(saved, manifest=data.manifest)  # read once: the task's evaluation reads it no more
    task = build_task(cfg, saved)
    model = task.build_model()
    model.load_state_dict(state["model"])
    model.to(device).eval()
    return Trained(task, model, cfg, saved, folder, device, chosen.reason)


def evaluate_checkpoint(
    checkpoint: str | Path,
    data_dir: str | Path | None = None,
    split: str = "test",
    *,
    folds: int | None = None,
    data: DataInfo | None = None,
    workers: int = 1,
) -> dict[str, float]:
    """The task's metrics of a checkpoint on ``split`` (:func:`load_trained`; ``data``: the dataset's facts,
    when read already); ``folds`` overrides ``eval.folds`` (the pairs task's COCO 1K protocol). With
    ``workers`` > 1, that many local processes (a gloo group) each embed a share of the split's batches and
    the first computes the metrics (:meth:`raydist.tasks.Task.evaluate_on_ranks`): the same values."""
    overrides = {"eval.folds": folds} if folds is not None else None
    if workers < 1:
        raise ValueError(f"workers={workers}: expected >= 1")
    if workers == 1:
        return load_trained(checkpoint, data_dir, overrides=overrides, data=data).evaluate(split)
    with tempfile.TemporaryDirectory(prefix="raydist-eval-") as tmp:
        out = Path(tmp) / "metrics.json"
        args = (workers, str(Path(tmp) / "rendezvous"), str(checkpoint), data_dir, split, overrides, str(out))
        spawn(_evaluate_rank, args, nprocs=workers)
        return json.loads(out.read_text())


def _evaluate_rank(
    rank: int,
    world: int,
    rendezvous: str,
    checkpoint: str,
    data_dir: str | Path | None,
    split: str,
    overrides: dict[str, Any] | None,
    out: str,
) -> None:
    """One process of :func:`evaluate_checkpoint` with workers: its share of the embedding, rank 0 the metrics
    (written to ``out``)."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        trained = load_trained(checkpoint, data_dir, overrides=overrides)
        metrics = trained.task.evaluate_on_ranks(trained.model, split, trained.device)
        if metrics is not None:
            Path(out).write_text(json.dumps(metrics))
    finally:
        dist.destroy_process_group()


def check_resume(
    state: dict[str, Any], saved_cfg: Config, folder: str | Path, cfg: Config, info: DataInfo
) -> None:
    """Refuse to continue a checkpoint's training with ``cfg`` on the data ``info`` describes when its data
    facts differ (:func:`check_data_fits`) or when the model ``cfg`` builds has other tensor names or shapes
    than the saved one (:func:`raydist.checkpoint.check_model_fits`, which names the config keys to blame)."""
    check_data_fits(DataInfo.from_checkpoint(folder, load_task_info(folder)), info, folder)
    check_model_fits(
        state["model"], saved_cfg, cfg, lambda c: build_task(c, info).build_model(), saved_from=str(folder)
    )


def resume_checkpoint(checkpoint: str | Path, cfg: Config, data_dir: str | Path) -> Path:
    """The checkpoint folder a run resumes from (a run folder's newest), after :func:`check_resume` against
    ``cfg`` and the dataset ``data_dir``: the driver calls it before any Ray work starts."""
    state, saved_cfg, folder = load_checkpoint(checkpoint)
    check_resume(state, saved_cfg, folder, cfg, DataInfo.from_dataset(data_dir))
    return folder


def checkpoint_retrieval_report(
    checkpoint: str | Path,
    data_dir: str | Path | None = None,
    *,
    split: str = "test",
    dims: Sequence[int] | None = None,
    baseline_checkpoint: str | Path | None = None,
    **options: Any,
) -> dict[str, Any]:
    """:func:`raydist.eval.retrieve.retrieval_report` of ``split`` embedded by a checkpoint, at
    :meth:`Trained.retrieval_dims`; ``baseline_checkpoint`` embeds the same split for the baselines."""
    trained = load_trained(checkpoint, data_dir)
    baseline = None
    if baseline_checkpoint is not None:
        baseline = load_trained(baseline_checkpoint, trained.data_info.data_dir).embed(split)
    return retrieval_report(
        trained.embed(split), dims=trained.retrieval_dims(dims), baseline=baseline, **options
    )


def write_checkpoint_indexes(
    checkpoint: str | Path,
    out_dir: str | Path,
    data_dir: str | Path | None = None,
    *,
    split: str = "test",
    dims: Sequence[int] | None = None,
    kind: str = "flat",
    budget: IndexBudget | None = None,
    **index_options: Any,
) -> tuple[RetrievalSet, list[int]]:
    """Index ``split`` embedded by a checkpoint at :meth:`Trained.retrieval_dims` into ``out_dir``
    (:func:`raydist.retrieval.index.build_indexes`; with ``budget`` the one index chosen under it,
    :func:`raydist.retrieval.budget.write_budget_index`); returns the embedded split and the dims."""
    trained = load_trained(checkpoint, data_dir)
    rset, dims = trained.embed(split), trained.retrieval_dims(dims)
    if budget is not None:
        return rset, [write_budget_index(rset, dims, budget, out_dir, progress=say).best.dim]
    build_indexes(rset, dims, kind, out_dir, **index_options)
    return rset, dims
