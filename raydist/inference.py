"""From a checkpoint to a model: resolve the folder, load it, rebuild the task and its model, and check that
the data and the config fit the saved state. Evaluation, retrieval, indexes and resumed runs all start here."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn

from raydist.checkpoint import (
    STATE_FILE,
    check_model_fits,
    find_checkpoint,
    load_checkpoint,
    load_task_info,
    local_folder,
    newest_checkpoint,
    read_config,
    recorded_dataset,
    run_checkpoints,
)
from raydist.config import Config, ConfigError, apply_overrides, validate
from raydist.data.image_transforms import decode_image, image_pixels
from raydist.data.schema import SPLITS
from raydist.data.standardize import STANDARDIZATION_NAME, standardize_features
from raydist.eval.faiss_index import FaissIndex, unit_rows
from raydist.eval.retrieve import (
    INDEX_META,
    RetrievalSet,
    build_indexes,
    concat_sets,
    default_dims,
    load_indexes,
    retrieval_report,
)
from raydist.runfiles import BEST_CHECKPOINT_FILE
from raydist.tasks import DataInfo, Task, build_task

ALL_SPLITS = "all"  # a split name that means every split of the dataset (train, val and test, in that order)


@dataclass(frozen=True)
class ChosenCheckpoint:
    """A checkpoint folder and why it was chosen: the folder given, ``best by val/<metric> = …`` or ``latest``."""

    path: Path
    reason: str

    def __str__(self) -> str:
        return f"{self.path} ({self.reason})"


def record_best_checkpoint(run_dir: str | Path, best: str | Path, metric: str, value: float | None) -> Path:
    """Write the run folder's ``best_checkpoint.json``: the best checkpoint's folder name, the val metric that
    chose it and its value, and the run's newest checkpoint now (a newer one, from a resumed run, makes the
    record stale and :func:`choose_checkpoint` then scores the checkpoints itself)."""
    run_dir = Path(run_dir)
    newest = newest_checkpoint(run_dir)
    record = {
        "checkpoint": Path(best).name,
        "metric": metric,
        "value": value,
        "newest": newest.name if newest else None,
    }
    path = run_dir / BEST_CHECKPOINT_FILE
    path.write_text(json.dumps(record, indent=1))
    return path


def _recorded_best(run_dir: Path, newest: Path) -> ChosenCheckpoint | None:
    """The checkpoint ``best_checkpoint.json`` names, when the file exists, is current (its newest checkpoint
    is still the run's newest) and the folder it names is complete; else None."""
    path = run_dir / BEST_CHECKPOINT_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        name, metric, value, recorded_newest = (
            record[k] for k in ("checkpoint", "metric", "value", "newest")
        )
    except (OSError, json.JSONDecodeError, TypeError, KeyError) as e:
        raise ValueError(
            f"{path}: unreadable record of the best checkpoint ({e!r}); expected a JSON object with "
            "checkpoint, metric, value and newest: delete it to choose by the checkpoints' "
            "val metrics"
        ) from e
    if recorded_newest != newest.name or not (run_dir / str(name) / STATE_FILE).is_file():
        return None
    shown = f" = {value:.4g}" if isinstance(value, (int, float)) else ""
    return ChosenCheckpoint(run_dir / str(name), f"best by {metric}{shown}")


def checkpoint_score(folder: str | Path, metric: str) -> float | None:
    """The val metric a checkpoint was reported with: the last epoch of the history it carries
    (``state["loop"]["history"]``) when that epoch ended at the checkpoint's step; None for a mid-epoch
    checkpoint or one without a history. ``state.pt`` is memory-mapped, so its tensors are not read."""
    path = Path(folder) / STATE_FILE
    try:
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:  # torch raises several types for truncated/corrupt files
        raise ValueError(f"{path}: unreadable checkpoint state: {e}") from e
    loop = state.get("loop") or {}
    history = loop.get("history") or []
    if not history or history[-1].get("step") != loop.get("global_step"):
        return None
    value = history[-1].get(metric)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def choose_checkpoint(path: str | Path, *, latest: bool = False) -> ChosenCheckpoint:
    """The checkpoint a path means: a checkpoint folder is itself; a run folder means its best checkpoint
    (the one Ray Train picked by the run's val metric, ``val/<task.primary_metric>``), or with ``latest`` its
    newest. The best is read from the run's ``best_checkpoint.json`` (written when a run finishes) or, when that
    is missing or stale, chosen by each checkpoint's own val metric (:func:`checkpoint_score`; ties go to the
    older); a run with no scored checkpoint gives its newest."""
    given = local_folder(path)  # a URI's local copy
    folder = find_checkpoint(given)  # a checkpoint folder, or the run folder's newest (clear errors if not)
    if folder == given:
        return ChosenCheckpoint(folder, "the checkpoint given")
    if latest:
        return ChosenCheckpoint(folder, "latest")
    run_dir = folder.parent
    recorded = _recorded_best(run_dir, folder)
    if recorded is not None:
        return recorded
    task = build_task(read_config(folder), DataInfo.from_checkpoint(folder, load_task_info(folder)))
    metric = f"val/{task.primary_metric}"
    scores = {c: checkpoint_score(c, metric) for c in run_checkpoints(run_dir)}
    scored = {c: v for c, v in scores.items() if v is not None}
    if not scored:
        return ChosenCheckpoint(folder, f"latest: no checkpoint has a {metric}")
    best = max(scored, key=lambda c: scored[c])  # the first (oldest) of equal scores
    return ChosenCheckpoint(best, f"best by {metric} = {scored[best]:.4g}")


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
        ``"all"`` embeds every split and joins them (:func:`raydist.eval.retrieve.concat_sets`)."""
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
) -> Trained:
    """Load a checkpoint folder, or a run folder's best checkpoint (its newest with ``latest``;
    :func:`choose_checkpoint`), for use on ``data_dir`` (default: the dataset it was trained on): its config
    with ``overrides`` (e.g. ``eval.folds``), its task and model with the saved weights. The data is checked
    against the checkpoint first (:func:`check_data_fits`); with ``need_data=False`` a checkpoint whose dataset
    is gone still loads (``data_info.data_dir`` None: new inputs only, no splits)."""
    chosen = choose_checkpoint(checkpoint, latest=latest)
    state, cfg, folder = load_checkpoint(chosen.path)
    if overrides:
        cfg = apply_overrides(cfg, overrides)
        validate(cfg)
    recorded = load_task_info(folder).get("data_dir")
    if need_data or data_dir is not None or (recorded and Path(recorded).is_dir()):
        data_dir = recorded_dataset(folder, data_dir)
    saved = DataInfo.from_checkpoint(folder, load_task_info(folder), data_dir)
    if data_dir is not None:
        check_data_fits(saved, DataInfo.from_dataset(data_dir), folder)
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
) -> dict[str, float]:
    """The task's metrics of a checkpoint on ``split`` (:func:`load_trained`); ``folds`` overrides
    ``eval.folds`` (the pairs task's COCO 1K protocol)."""
    overrides = {"eval.folds": folds} if folds is not None else None
    return load_trained(checkpoint, data_dir, overrides=overrides).evaluate(split)


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
    **index_options: Any,
) -> tuple[RetrievalSet, list[int]]:
    """Index ``split`` embedded by a checkpoint at :meth:`Trained.retrieval_dims` into ``out_dir``
    (:func:`raydist.eval.retrieve.build_indexes`); returns the embedded split and the dims."""
    trained = load_trained(checkpoint, data_dir)
    rset, dims = trained.embed(split), trained.retrieval_dims(dims)
    build_indexes(rset, dims, kind, out_dir, **index_options)
    return rset, dims


class Embedder:
    """A trained model for new inputs: texts, feature vectors and images → embeddings (float32 numpy rows), computed as
    evaluation embeds a split (:meth:`raydist.tasks.Task.embed_texts` / ``embed_features``). With ``dim`` the
    Matryoshka prefix ``normalize(z[:, :dim])``, re-normalised as retrieval does."""

    def __init__(self, trained: Trained, dim: int | None = None) -> None:
        full = trained.config.model.embed_dim
        if dim is not None and not 1 <= dim <= full:
            raise ValueError(f"dim={dim}: expected 1 <= dim <= {full} (the checkpoint's model.embed_dim)")
        self.trained, self.dim = trained, dim

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        *,
        dim: int | None = None,
        latest: bool = False,
        device: torch.device | str = "cpu",
    ) -> Embedder:
        """Load a checkpoint folder, or a run folder's best checkpoint (its newest with ``latest``), with
        :func:`load_trained`; the dataset it was trained on is not needed."""
        return cls(load_trained(path, device=device, latest=latest, need_data=False), dim)

    @property
    def checkpoint(self) -> ChosenCheckpoint:
        """The checkpoint folder loaded and why it was chosen."""
        return ChosenCheckpoint(self.trained.checkpoint_path, self.trained.chosen)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings [N, dim] of raw texts (captions, tokenised with the checkpoint's vocabulary)."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("embed_texts: expected a list of strings (wrap a single text in a list)")
        if not texts:
            raise ValueError("embed_texts: no texts given")
        try:
            emb = self.trained.task.embed_texts(self.trained.model, list(texts), self.trained.device)
        except NotImplementedError as e:  # a task without a text side: bad input, not a failure
            raise ValueError(str(e)) from e
        return self._cut(emb)

    def embed_features(self, features: np.ndarray) -> np.ndarray:
        """Embeddings [N, dim] of feature vectors [N, feature_dim] (image features for ``pairs``, the samples'
        vectors for ``labels``), given as the source data holds them: when the dataset was converted with
        ``--standardize``, its saved train statistics are applied here, as they were to every split."""
        x = np.asarray(features, dtype=np.float64)  # standardised before float32, as the converter does
        want = self.trained.data_info.feature_dim
        if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] != want:
            raise ValueError(
                f"embed_features: expected an array of shape [N >= 1, {want}] (the checkpoint's "
                f"feature_dim), got {x.shape}"
            )
        stats = self.trained.data_info.files.get(STANDARDIZATION_NAME)
        x = standardize_features(x, stats) if stats is not None else x.astype(np.float32)
        return self._cut(self.trained.task.embed_features(self.trained.model, x, self.trained.device))

    def embed_images(self, images: Sequence[bytes | Image.Image]) -> np.ndarray:
        """Embeddings [N, dim] of images (encoded PNG/JPEG bytes, or Pillow images) for a model trained on
        encoded images: decoded to the dataset's channels and made into the eval view evaluation uses (resize +
        centre crop, normalise; :func:`raydist.tasks.images.pixel_views`). Bytes that do not decode raise a
        ValueError naming the item."""
        if isinstance(images, (bytes, Image.Image)) or not len(images):
            raise ValueError(
                "embed_images: expected a non-empty list of images (wrap a single image in a list)"
            )
        channels = self.trained.data_info.image_channels or 3
        pixels = []
        for i, image in enumerate(images):
            if isinstance(image, Image.Image):
                pixels.append(image_pixels(image, channels))
            elif isinstance(image, (bytes, bytearray, memoryview)):
                try:
                    pixels.append(decode_image(bytes(image), channels))
                except (OSError, ValueError, Image.DecompressionBombError) as e:
                    raise ValueError(f"images[{i}]: not a decodable PNG/JPEG image ({e})") from e
            else:
                raise TypeError(f"images[{i}]: expected bytes or a PIL image, got {type(image).__name__}")
        try:
            emb = self.trained.task.embed_images(self.trained.model, pixels, self.trained.device)
        except NotImplementedError as e:  # a model trained on feature vectors: bad input, not a failure
            raise ValueError(str(e)) from e
        return self._cut(emb)

    def _cut(self, emb: torch.Tensor) -> np.ndarray:
        z = emb.numpy().astype(np.float32, copy=False)
        return z if self.dim is None else unit_rows(z[:, : self.dim])


@dataclass(frozen=True)
class SearchResult:
    """Top-k of each query in an index: dataset ids [Q, k] (``indexes.json``'s ``database_ids``), inner
    products of unit vectors [Q, k] best first, the dim searched and the checkpoint that embedded the queries."""

    ids: np.ndarray
    scores: np.ndarray
    dim: int
    checkpoint: ChosenCheckpoint
    meta: dict[str, Any]


def read_queries(path: str | Path) -> list[str] | np.ndarray:
    """A ``--queries`` file: ``.npy`` → feature vectors [N, D]; any other file → one text per non-empty line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"queries file {path} does not exist")
    if path.suffix == ".npy":
        features = np.load(path, allow_pickle=False)
        if features.ndim != 2 or len(features) == 0:
            raise ValueError(
                f"{path}: expected a 2-D array of feature vectors [N >= 1, D], got shape {features.shape}"
            )
        return features
    texts = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not texts:
        raise ValueError(f"{path}: no queries (expected one text per line)")
    return texts


def open_index(
    index_dir: str | Path, checkpoint: str | Path | None = None
) -> tuple[dict[int, FaissIndex], dict[str, Any], Embedder]:
    """An index folder written by ``raydist index`` (:func:`write_checkpoint_indexes`): its indexes by dim, its
    ``indexes.json`` (with ``database_ids``) and the Embedder of the checkpoint it records (or
    ``checkpoint``), refused when that model's task is not the index's."""
    index_dir = Path(index_dir)
    if not (index_dir / INDEX_META).is_file():
        raise FileNotFoundError(
            f"{index_dir}: no {INDEX_META}; build an index with "
            f"`raydist index --checkpoint RUN --out {index_dir}`"
        )
    indexes, meta = load_indexes(index_dir)
    embedder = Embedder.from_checkpoint(checkpoint or meta["checkpoint"])
    if embedder.trained.task.name != meta["task"]:
        raise ValueError(
            f"checkpoint {embedder.trained.checkpoint_path} is a {embedder.trained.task.name!r} model; "
            f"the index at {index_dir} holds {meta['task']!r} embeddings"
        )
    return indexes, meta, embedder


def search_index(
    index_dir: str | Path,
    queries: Sequence[str] | np.ndarray,
    *,
    k: int = 10,
    dim: int | None = None,
    checkpoint: str | Path | None = None,
) -> SearchResult:
    """Search an index folder written by ``raydist index`` (:func:`open_index`) with texts or feature vectors,
    embedded by the checkpoint the index records (or ``checkpoint``): top-``k`` dataset ids at ``dim``
    (default: the index's largest dim), best first."""
    if k < 1:
        raise ValueError(f"--k {k}: expected k >= 1")
    indexes, meta, embedder = open_index(index_dir, checkpoint)
    dim = max(indexes) if dim is None else dim
    if dim not in indexes:
        raise ValueError(f"--dim {dim}: {Path(index_dir) / INDEX_META} has indexes at dims {sorted(indexes)}")
    texts = not isinstance(queries, np.ndarray)
    vectors = embedder.embed_texts(list(queries)) if texts else embedder.embed_features(queries)
    scores, rows = indexes[dim].search(vectors[:, :dim], min(k, indexes[dim].ntotal))
    return SearchResult(meta["database_ids"][rows], scores, dim, embedder.checkpoint, meta)
