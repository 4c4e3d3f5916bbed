"""The task interface: what is specific to one kind of data (columns, batch → tensors, model, loss,
evaluator, checkpoint extras); the registry that finds a task by name is :mod:`raydist.tasks.registry`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from raydist.config import Config, ConfigError, option_kinds
from raydist.data.manifest import Manifest, load_manifest
from raydist.distributed import GatheredBatch, NegativeSet, global_rank, world_size
from raydist.distributed.shards import sharded_batches
from raydist.losses import LossInputs, LossKind, get_loss, nested_rank_loss
from raydist.losses.kinds import task_losses
from raydist.retrieval.sets import RetrievalSet


@dataclass(frozen=True)
class DataInfo:
    """Facts about the data a task's model depends on; from a dataset folder or a checkpoint's task.json."""

    task: str
    feature_dim: int | None  # precomputed features' dim; None for encoded images
    num_classes: int | None = None
    data_dir: Path | None = None  # the dataset folder, when there is one
    files: dict[str, Path] = field(default_factory=dict)  # extra files (vocab.json, tokenizer.json, ...)
    image_format: str = "features"  # "features" (vectors) or "encoded" (PNG/JPEG bytes, one row per image)
    image_channels: int | None = None  # encoded images: 1 when every image is greyscale, else 3
    image_size: tuple[int, int] | None = None  # encoded images: the train split's median [height, width]
    # the dataset's manifest as read once by from_dataset (a run plan hands it down: nothing reads it again);
    # None for facts from a checkpoint
    manifest: Manifest | None = field(default=None, compare=False, repr=False)

    @property
    def encoded(self) -> bool:
        """Whether the ``image`` column holds encoded images (decoded and augmented in the data pipeline)."""
        return self.image_format == "encoded"

    @classmethod
    def from_dataset(cls, data_dir: str | Path, manifest: Manifest | None = None) -> DataInfo:
        """From a dataset folder's manifest (``manifest``: when read already), which it keeps."""
        data_dir = Path(data_dir)
        m = manifest if manifest is not None else load_manifest(data_dir)
        files = {name: data_dir / name for name in (m.vocab, m.standardization, m.tokenizer) if name}
        return cls(
            m.task,
            m.feature_dim,
            m.num_classes,
            data_dir,
            files,
            m.image_format,
            m.image_channels,
            tuple(m.image_size) if m.image_size else None,
            m,
        )

    @classmethod
    def from_checkpoint(
        cls, folder: str | Path, info: dict[str, Any], data_dir: str | Path | None = None
    ) -> DataInfo:
        """From a checkpoint folder's ``task.json`` (its extra files live in the checkpoint folder)."""
        folder = Path(folder)
        files = {name: folder / name for name in info.get("files", [])}
        dim, size = info.get("feature_dim"), info.get("image_size")
        return cls(
            info["task"],
            int(dim) if dim is not None else None,
            info.get("num_classes"),
            Path(data_dir) if data_dir else None,
            files,
            info.get("image_format", "features"),
            info.get("image_channels"),
            tuple(size) if size else None,
        )

    def to_json(self) -> dict[str, Any]:
        """What a checkpoint's ``task.json`` records (the dataset folder too, so eval can find it)."""
        return {
            "task": self.task,
            "feature_dim": self.feature_dim,
            "num_classes": self.num_classes,
            "files": sorted(self.files),
            "data_dir": str(self.data_dir) if self.data_dir else None,
            "image_format": self.image_format,
            "image_channels": self.image_channels,
            "image_size": list(self.image_size) if self.image_size else None,
        }

    def mismatch(self, other: DataInfo) -> list[str]:
        """What differs between a checkpoint's data facts (self) and a dataset's (other), one line each:
        task, feature dim, classes, the vocabulary and the tokenizer."""
        lines = [
            f"{name}: checkpoint={getattr(self, name)!r} data={getattr(other, name)!r}"
            for name in ("task", "image_format", "feature_dim", "num_classes", "image_channels")
            if getattr(self, name) != getattr(other, name)
        ]
        for name in sorted(set(self.files) & set(other.files)):
            if Path(self.files[name]).read_bytes() != Path(other.files[name]).read_bytes():
                lines.append(f"{name}: the checkpoint's {name} differs from {other.files[name]}")
        return lines


@dataclass
class Encoded:
    """A step's model outputs: embeddings (gathered with autograd), ids (gathered without), and
    rank-local extras (logits, targets)."""

    embeddings: dict[str, Tensor]
    ids: dict[str, Tensor]
    extras: dict[str, Tensor] = field(default_factory=dict)

    def weighted(self, weights: Tensor) -> Encoded:
        """The same outputs with row i's *gradient* scaled by ``weights[i]`` on its way back (values
        unchanged): the parameters then receive ``Σ_i w_i c_i``, where c_i is row i's contribution (the
        gradient that flows through its activations). Applies to the per-row tensors a loss reads: the
        embeddings and the ``logits`` extra (a tensor or one per nested dim). Each is replaced by a new node,
        so a path through two of them (logits computed from an embedding) is still scaled once."""
        w = weights.reshape(-1, 1)

        def scale(x: Tensor) -> Tensor:
            return x.detach() + w.to(x) * (x - x.detach())

        extras = dict(self.extras)
        if "logits" in extras:
            logits = extras["logits"]
            extras["logits"] = [scale(x) for x in logits] if isinstance(logits, list) else scale(logits)
        return Encoded({k: scale(v) for k, v in self.embeddings.items()}, self.ids, extras)


@dataclass(frozen=True)
class StepContext:
    """Where the loop is: epoch (0-based), global step, rank and world size; during a step, its batch
    (tensors on the device) for hooks that need the rows (e.g. their sample ids)."""

    epoch: int
    global_step: int
    rank: int
    world: int
    batch: dict[str, Tensor] | None = None


# Config keys every task reads (``section.*``: the whole section); a task adds its own in ``Task.config_keys``,
# and reads the ``loss.<option>`` keys of its loss kind (raydist.losses: the kind's options).
COMMON_CONFIG_KEYS = (
    "plugins",
    "data.path",
    "data.shuffle_buffer",
    "data.in_memory_max_mb",
    "data.train_fraction",
    "model.embed_dim",
    "model.nesting",
    "loss.kind",
    "loss.nesting_weights",
    "train.*",
    "eval.batch_size",
    "gc.*",
    "debug.*",
    "model.image_encoder",
    "model.image_weights",
    "data.image_size",
    "data.flip",
    "data.crop",
    "data.crop_pad",
    "data.crop_scale",
    "model.cnn_width",
    "model.cnn_depth",
    "model.cnn_grid",
    "data.transform_cpus",
    "data.transform_concurrency",
)
PROBE_LOSS = "loss/probe"  # step statistic: the part of Task.loss that trains a probe, not the embeddings


class Task(ABC):
    """One kind of data. Subclasses set the class attributes and implement the abstract methods, then
    are listed in :mod:`raydist.tasks.registry` (or registered with its ``register_task``); the loop, trainer
    and evaluator never look inside."""

    name: ClassVar[str]
    columns: ClassVar[tuple[str, ...]]  # shard columns read for training
    primary_metric: ClassVar[str]  # validation metric that picks the best checkpoint (higher is better)
    gathers: bool = True  # whether the loss needs the global batch of all workers (from the loss kind)
    per_example_losses: bool = False  # the loss is a mean of per-example terms (from the loss kind)
    # the registered loss kind (raydist.losses: LossKind.task = this task's name) that loss.kind=auto means;
    # None: the task computes its own loss (loss.kind auto only)
    default_loss: ClassVar[str | None] = None
    # The config keys the task reads beyond COMMON_CONFIG_KEYS and its loss kind's ``loss.<option>`` keys,
    # each with the loss kinds that read it (None: every kind). A key set away from its default that the run's
    # task and loss kind do not read is refused before Ray starts (raydist.tasks.registry.check_task_config).
    config_keys: ClassVar[dict[str, tuple[str, ...] | None]] = {}
    noisy_label_patience: ClassVar[int] = 0  # train.early_stop_patience by default when data.label_noise > 0

    @classmethod
    def losses(cls) -> tuple[str, ...]:
        """The loss kinds that train this task, the default (what ``auto`` means) first; () = its own loss."""
        return task_losses(cls.name, cls.default_loss)

    @classmethod
    def loss_kind(cls, cfg: Config) -> str:
        """``loss.kind`` with ``auto`` resolved to the task's default loss."""
        return cls.default_loss if cfg.loss.kind == "auto" and cls.default_loss else cfg.loss.kind

    @classmethod
    def loss_readers(cls, key: str) -> tuple[str, ...] | None:
        """The loss kinds of this task that read ``key`` (None: every kind; () none): a ``loss.<option>`` key
        from the kinds' options, another key from :attr:`config_keys`."""
        section, _, option = key.partition(".")
        readers = option_kinds(option) if section == "loss" else []
        if readers:
            return tuple(kind for kind in cls.losses() if kind in readers)
        return cls.config_keys.get(key, ())

    @classmethod
    def reads(cls, key: str, kind: str | None = None) -> bool:
        """Whether the task reads the dotted config ``key`` (with loss kind ``kind``; None: with any kind)."""
        if key in COMMON_CONFIG_KEYS or f"{key.partition('.')[0]}.*" in COMMON_CONFIG_KEYS:
            return True
        kinds = cls.loss_readers(key)
        return kinds is None or (bool(kinds) and (kind is None or kind in kinds))

    @classmethod
    def early_stop_patience(cls, cfg: Config) -> int:
        """``train.early_stop_patience``, its null resolved: :attr:`noisy_label_patience` epochs when
        ``data.label_noise`` flips train labels (a noisy run overfits the flipped labels), else 0 (off)."""
        patience = cfg.train.early_stop_patience
        if patience is not None:
            return patience
        return cls.noisy_label_patience if cfg.data.label_noise > 0 else 0

    def __init__(self, cfg: Config, info: DataInfo) -> None:
        self.cfg, self.info = cfg, info
        self.loss_fn: LossKind | None = None  # the run's loss kind (raydist.losses), built from cfg
        if self.default_loss:
            kind = self.loss_kind(cfg)
            if kind not in self.losses():
                raise ConfigError(
                    f"loss.kind={cfg.loss.kind!r} does not fit task {self.name!r}; use one of "
                    f"{', '.join(self.losses())}"
                )
            self.loss_fn = get_loss(kind)(cfg)
            self.gathers, self.per_example_losses = self.loss_fn.gathers, self.loss_fn.per_example

    def add_loss_module(self, model: nn.Module) -> nn.Module:
        """``model`` with the loss kind's learnable parameters (:meth:`LossKind.module`) as an attribute, so
        DDP averages their gradients and the optimizer steps them."""
        module = self.loss_fn.module(self.info.num_classes) if self.loss_fn else None
        if module is not None:
            model.add_module(self.loss_fn.module_name, module)
        return model

    def nested_loss(
        self, loss: Callable[[LossInputs], Tensor], encoded: Encoded, inputs: LossInputs
    ) -> Tensor:
        """``loss`` on ``inputs`` in the one Matryoshka sum over ``model.nesting`` with ``loss.nesting_weights``
        (:func:`raydist.losses.nested_rank_loss`: the prefixes of ``encoded``'s embeddings)."""
        cfg = self.cfg
        return nested_rank_loss(
            loss, inputs, tuple(encoded.embeddings), cfg.model.nesting, cfg.loss.nesting_weights
        )

    @abstractmethod
    def transform(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Shard columns → model-ready numpy arrays (runs in Ray Data ``map_batches``, or once in memory)."""

    def stream_transform(self) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
        """:meth:`transform` as the picklable callable Ray Data's tasks run. The default, the bound method,
        imports the task's module (torch included) in every data worker; tasks return an object from a
        torch-free module (:mod:`raydist.data.transforms`) instead."""
        return self.transform

    def epoch_transform(self) -> Callable[[dict[str, np.ndarray], int], dict[str, np.ndarray]] | None:
        """``(batch, epoch) → batch`` run on every batch of an in-memory split after :meth:`transform` ran once
        (encoded images: that epoch's random views); None when batches need nothing per epoch."""
        return None

    @abstractmethod
    def build_model(self) -> nn.Module:
        """A fresh model for this data."""

    @abstractmethod
    def encode(self, model: nn.Module, batch: dict[str, Tensor]) -> Encoded:
        """Forward pass of one step's batch."""

    def loss(
        self,
        encoded: Encoded,
        gathered: GatheredBatch,
        negative_set: NegativeSet,
        ctx: StepContext,
        stats: dict[str, float],
    ) -> Tensor:
        """This rank's loss (scaled so that DDP's average gives the global loss's gradient); may add
        per-step statistics to ``stats``. Default: the run's loss kind in the Matryoshka sum (a task without
        a :attr:`default_loss` overrides it)."""
        if self.loss_fn is None:
            raise NotImplementedError(f"task {self.name!r}: set default_loss or override loss()")
        inputs = LossInputs(gathered, negative_set, encoded.extras, ctx.epoch, ctx.global_step, stats)
        return self.nested_loss(self.loss_fn.loss, encoded, inputs)

    def evaluate(self, model: nn.Module, split: str, device: torch.device | str = "cpu") -> dict[str, float]:
        """Metrics of ``model`` on a split of ``info.data_dir`` (clean labels where there are any):
        ``eval_metrics(eval_embeddings(model, split))``. A task implements those two halves (its embedding is
        then shared out over a run's workers: :meth:`evaluate_on_ranks`) or overrides this method alone (then
        one process evaluates)."""
        return self.eval_metrics(self.eval_embeddings(model, split, device), split)

    def eval_embeddings(self, model: nn.Module, split: str, device: torch.device | str = "cpu") -> Any:
        """A split embedded for evaluation, what :meth:`eval_metrics` scores. Its batch loops go through
        :func:`raydist.distributed.shards.map_batches`, so that each rank can embed a share of them."""
        raise NotImplementedError(
            f"task {self.name!r}: implement eval_embeddings and eval_metrics, or evaluate"
        )

    def eval_metrics(self, embedded: Any, split: str) -> dict[str, float]:
        """The metrics of a split embedded by :meth:`eval_embeddings`."""
        raise NotImplementedError(
            f"task {self.name!r}: implement eval_embeddings and eval_metrics, or evaluate"
        )

    def evaluate_on_ranks(
        self, model: nn.Module, split: str, device: torch.device | str = "cpu"
    ) -> dict[str, float] | None:
        """:meth:`evaluate` by every rank of the default process group together: each embeds its share of the
        split's batches (:func:`raydist.distributed.shards.sharded_batches`), one gather per embedding pass
        gives every rank the whole split, and rank 0 alone computes the metrics -- the values one process
        computes. Every rank must call it; rank 0 gets the metrics, the others None. Without a process group,
        or for a task that overrides :meth:`evaluate` alone, rank 0 evaluates alone."""
        rank = global_rank()
        if world_size() == 1 or type(self).evaluate is not Task.evaluate:
            return self.evaluate(model, split, device) if rank == 0 else None
        with sharded_batches():
            embedded = self.eval_embeddings(model, split, device)
        return self.eval_metrics(embedded, split) if rank == 0 else None

    def embed(self, model: nn.Module, split: str, device: torch.device | str = "cpu") -> RetrievalSet:
        """A split of ``info.data_dir`` embedded by ``model`` as queries and database with their relevance keys
        and dataset ids (what retrieval, indexes and exported embeddings use)."""
        raise NotImplementedError(f"task {self.name!r} does not embed splits for retrieval")

    def embed_features(
        self, model: nn.Module, features: np.ndarray, device: torch.device | str = "cpu"
    ) -> Tensor:
        """Embeddings [N, embed_dim] (on the CPU) of ``image``-column vectors [N, feature_dim], computed as
        :meth:`embed` computes a split's: what a trained model offers for new inputs."""
        raise NotImplementedError(f"task {self.name!r} does not embed feature vectors")

    def embed_texts(
        self, model: nn.Module, texts: Sequence[str], device: torch.device | str = "cpu"
    ) -> Tensor:
        """Embeddings [N, embed_dim] (on the CPU) of raw texts, tokenised as the task's data path does."""
        raise NotImplementedError(f"task {self.name!r} has no text side: embed feature vectors instead")

    def embed_images(
        self, model: nn.Module, pixels: Sequence[np.ndarray], device: torch.device | str = "cpu"
    ) -> Tensor:
        """Embeddings [N, embed_dim] (on the CPU) of decoded images (uint8 H×W×C, the dataset's channels), each
        made into its eval view (resize + centre crop, normalise) as :meth:`embed` makes a split's images."""
        raise NotImplementedError(f"task {self.name!r} does not embed images")

    def local_loss(
        self, model: nn.Module, batch: dict[str, Tensor], ctx: StepContext, row_weights: Tensor | None = None
    ) -> Tensor:
        """The training loss of ``batch`` as one process holding only these rows would compute it: no
        collective, every row a query and all rows its keys (passes outside the training step: gradient
        clustering's reassignment and variance meter, on one worker). ``row_weights`` scale each row's
        gradient contribution (:meth:`Encoded.weighted`); ``ctx`` gives the epoch (loss phase) and the step
        (seeded miners)."""
        encoded = self.encode(model, batch)
        if row_weights is not None:
            encoded = encoded.weighted(row_weights)
        first = next(iter(encoded.embeddings.values()))
        rows = torch.arange(first.shape[0], device=first.device)
        local = {**encoded.embeddings, **encoded.ids}
        gathered = GatheredBatch(local, dict(local), rows, rows, 0, 1)
        return self.loss(encoded, gathered, NegativeSet(query_rows=rows.cpu(), key_rows=None), ctx, {})

    def row_loss_scale(self, batch_rows: int) -> float:
        """s such that the backpropagated loss is ``s · Σ_i c_i`` over this rank's row contributions c_i:
        1/B for a mean over rows (:attr:`per_example_losses`); 1 for losses that are not sums over rows (each
        row's contribution is then the gradient that flows through its activations, and the contributions sum
        to the batch gradient)."""
        return 1.0 / batch_rows if self.per_example_losses else 1.0

    def data_notes(self) -> list[str]:
        """Lines about the data as this run reads it (e.g. how many captions are truncated), printed once per run
        by the driver before training."""
        return []

    def phase(self, epoch: int) -> str | None:
        """The loss phase of an epoch when a task switches losses (shown in progress and history); default:
        the loss kind's."""
        return self.loss_fn.phase(epoch) if self.loss_fn else None

    def end_epoch(self, epoch: int, metrics: dict[str, Any]) -> list[str]:
        """React to an epoch's training metrics (identical on every rank); return notes for the user;
        default: the loss kind's."""
        return self.loss_fn.end_epoch(epoch, metrics) if self.loss_fn else []

    def state_dict(self) -> dict[str, Any]:
        """What the task carries across restarts (saved in checkpoints); default: the loss kind's."""
        return self.loss_fn.state_dict() if self.loss_fn else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        if self.loss_fn:
            self.loss_fn.load_state_dict(state)

    def epoch_metrics(self, epoch: int) -> dict[str, Any]:
        """Extra per-epoch facts for the history (e.g. which loss phase ran); default: the loss kind's."""
        return self.loss_fn.epoch_metrics(epoch) if self.loss_fn else {}

    def summary(self, metrics: dict[str, Any]) -> str:
        """A short text of validation metrics for the progress line."""
        return f"val {self.primary_metric} {metrics.get(self.primary_metric, float('nan')):.1f}"

    def history_columns(self) -> list[tuple[str, str]]:
        """(validation metric key, column header) pairs of the per-epoch table."""
        return [(self.primary_metric, self.primary_metric)]


def smallest_prefix(cfg: Config) -> int | None:
    """The smallest ``model.nesting`` dim when it is below the embedding size (its metrics are reported
    as ``min_dim_<metric>`` next to the full-dim ones, so a sweep can score on both); else None."""
    dims = [d for d in cfg.model.nesting if d < cfg.model.embed_dim]
    return min(dims) if dims else None


def to_tensors(batch: dict[str, np.ndarray], device: torch.device | str) -> dict[str, Tensor]:
    """Numeric numpy columns → tensors on ``device`` (other columns are left out; read-only arrays, e.g.
    zero-copy Arrow buffers, are copied)."""
    return {
        k: torch.as_tensor(v if v.flags.writeable else v.copy()).to(device)
        for k, v in batch.items()
        if v.dtype != object
    }
