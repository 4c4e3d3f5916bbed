"""Train batches for the workers: a split small enough is read once into memory and reshuffled every
epoch; a larger one streams through Ray Data (``read_parquet`` → ``map_batches`` with the task's
transform, split across workers by Ray Train)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from raydist.data.epoch_board import EPOCH_COLUMN, EpochBoard
from raydist.data.manifest import Manifest, manifest_or_load
from raydist.data.schema import IMAGE
from raydist.data.shards import feature_matrix, read_split, split_files
from raydist.data.transforms import EpochTransform, EpochViews, PassViews, train_transform
from raydist.data.webdataset import is_tar_shard, webdataset_stream
from raydist.uris import join

Batch = dict[str, np.ndarray]
Transform = Callable[[Batch], Batch]


def memory_mb(data_dir: str | Path, split: str, *, manifest: Manifest | None = None) -> float:
    """MiB an in-memory split takes: float32 features, or for encoded images their decoded uint8 pixels
    (rows × the manifest's median height × width × channels). ``manifest``: the folder's, when read already."""
    manifest = manifest_or_load(data_dir, manifest)
    rows = manifest.splits[split].rows
    if manifest.image_format == "encoded":
        height, width = manifest.image_size
        return rows * height * width * manifest.image_channels / 2**20
    return rows * manifest.feature_dim * 4 / 2**20


def fits_in_memory(
    data_dir: str | Path, split: str, max_mb: int, *, manifest: Manifest | None = None
) -> bool:
    """Whether the split takes at most ``max_mb`` MiB in memory (:func:`memory_mb`; 0 = never)."""
    return max_mb > 0 and memory_mb(data_dir, split, manifest=manifest) <= max_mb


def split_columns(
    data_dir: str | Path,
    split: str,
    columns: Sequence[str],
    *,
    verify: bool = False,
    manifest: Manifest | None = None,
) -> Batch:
    """Columns of a split as numpy arrays: ``image`` as float32 [N, D] (features) or an object array of bytes
    (encoded images), ``captions`` as an object array of lists of strings, the rest as they are."""
    table = read_split(data_dir, split, verify=verify, manifest=manifest)
    out = {}
    for c in columns:
        column = table.column(c)
        if c == IMAGE and pa.types.is_fixed_size_list(column.type):
            out[c] = feature_matrix(column)
        elif pa.types.is_list(column.type):
            out[c] = np.empty(len(column), dtype=object)
            for i, value in enumerate(column.to_pylist()):  # row by row: equal-length lists stay lists
                out[c][i] = value
        else:
            out[c] = column.to_numpy(zero_copy_only=False)
    return out


def train_arrays(
    data_dir: str | Path,
    columns: Sequence[str],
    transform: Transform,
    *,
    fraction: float = 1.0,
    seed: int = 0,
    manifest: Manifest | None = None,
) -> Batch:
    """The whole train split, subset and transformed once (the in-memory path)."""
    return train_transform(transform, fraction, seed)(
        split_columns(data_dir, "train", columns, manifest=manifest)
    )


class InMemoryBatches:
    """Equal-size batches of a transformed in-memory split for rank ``rank`` of ``world``.

    Epoch e draws one permutation of all N rows from ``(seed, e)`` (the same on every rank); step s gives
    rank r the rows ``perm[s·W·m + r·m : s·W·m + (r+1)·m]`` (m = rows per worker); the remainder of
    N mod (W·m) rows is left out of that epoch, a different remainder each epoch. ``epoch_transform(batch, e)``,
    when given, runs on each of epoch e's batches (encoded images: that epoch's random views of the decoded
    pixels, so augmentation is drawn anew every epoch rather than once).
    """

    def __init__(
        self,
        arrays: Batch,
        *,
        rows: int,
        rank: int,
        world: int,
        seed: int,
        epoch_transform: EpochTransform | None = None,
    ) -> None:
        self.arrays, self.rows, self.rank, self.world, self.seed = arrays, rows, rank, world, seed
        self.epoch_transform = epoch_transform
        self.num_rows = len(next(iter(arrays.values())))

    def steps_per_epoch(self) -> int:
        """Full steps one epoch holds."""
        return self.num_rows // (self.rows * self.world)

    def epoch(self, epoch: int) -> Iterator[Batch]:
        """This rank's batches of epoch ``epoch``."""
        g = torch.Generator().manual_seed((self.seed * 7919 + epoch) * 131 + 17)
        perm = torch.randperm(self.num_rows, generator=g).numpy()
        step_rows = self.rows * self.world
        for s in range(self.steps_per_epoch()):
            start = s * step_rows + self.rank * self.rows
            idx = perm[start : start + self.rows]
            batch = {k: v[idx] for k, v in self.arrays.items()}
            yield batch if self.epoch_transform is None else self.epoch_transform(batch, epoch)


# Features per Ray Data read task (and block) of the train stream. Each epoch's new executor in Ray 2.60 starts
# with a zero resource budget for about its first second (the autoscaling coordinator's reply is not back and
# the global limits are cached for 1 s), so it runs one task at a time: fewer, larger tasks stream faster.
# `raydist bench data` (25 shards × 4100 rows × 256-d): 1 shard per task ≈ 65k rows/s, 5 ≈ 105k rows/s; the
# epoch's first batch comes ~0.15 s later (0.2 → 0.35 s).
READ_TASK_MB = 24


def read_tasks(data_dir: str | Path, files: int, *, manifest: Manifest | None = None) -> int:
    """Read tasks for the train split: about :data:`READ_TASK_MB` MiB of float32 features (or decoded pixels)
    each, whole shards per task, at least ``min(files, 4)`` tasks and at most one per shard."""
    return max(
        min(files, 4), min(files, math.ceil(memory_mb(data_dir, "train", manifest=manifest) / READ_TASK_MB))
    )


# Encoded images per block of the train stream. Their transform (decode, then the epoch's crop, resize, flip and
# normalise: about 1 ms an image on one core) costs far more than reading their bytes, so blocks are cut smaller
# than a read task: Ray Data then reads whole shards and runs the transform as separate tasks on these blocks, as
# many at once as the transform's concurrency allows, and the first block is ready after this many images.
IMAGES_PER_BLOCK = 256


def train_blocks(data_dir: str | Path, files: int, *, manifest: Manifest | None = None) -> int:
    """Blocks of the train stream: one per read task (:func:`read_tasks`: the transform runs in the read task);
    for encoded images one per :data:`IMAGES_PER_BLOCK` images when that is more."""
    manifest = manifest_or_load(data_dir, manifest)
    tasks = read_tasks(data_dir, files, manifest=manifest)
    if manifest.image_format != "encoded":
        return tasks
    return max(tasks, math.ceil(manifest.splits["train"].rows / IMAGES_PER_BLOCK))


def train_splits(epochs: int) -> tuple[str, ...]:
    """Ray Train dataset names of the streamed train split: two splits of the same stream when there is more
    than one epoch, even epochs from the first and odd ones from the second (:class:`StreamedEpochs`), so the
    next pass can start while one streams."""
    return ("train", "train_next") if epochs > 1 else ("train",)


def train_dataset(
    data_dir: str | Path,
    columns: Sequence[str],
    transform: Transform,
    *,
    num_cpus: float | None = None,
    concurrency: int | None = None,
    shards_at: str | None = None,
    manifest: Manifest | None = None,
) -> Any:
    """The Ray Data stream of the train split: shards → selected columns → the task's transform, read and
    transformed in one Ray task per :func:`read_tasks` group of consecutive shards, one block each. The shards
    are read from ``data_dir``, or from ``shards_at`` (the dataset's own location, e.g. its ``s3://`` URI: read
    by Ray Data's tasks on any node, straight from object storage) at the same paths inside it.
    ``num_cpus``/``concurrency`` (``data.transform_cpus``/``data.transform_concurrency``): the transform's
    logical CPUs per task and most tasks at once, when given (else Ray Data's defaults)."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # deterministic row order for a fixed seed
    ctx.enable_progress_bars = False
    manifest = manifest_or_load(data_dir, manifest)
    files = split_files(data_dir, "train", manifest=manifest)
    if shards_at is not None:
        files = [join(shards_at, shard.file) for shard in manifest.splits["train"].shards]
    # Ray 2.60's default Parquet reader (DataSourceV2) plans a split of small shards as one read task that
    # yields one block: nothing streams, and every epoch waits for the whole split to be read and transformed
    # before its first batch (bench/RESULTS.md, "data"). The V1 reader makes one read task per group of
    # shards. An explicit block count also keeps it from splitting each block in five, which would keep the
    # transform out of the read task (5× the tasks).
    v2 = getattr(ctx, "use_datasource_v2", False)
    ctx.use_datasource_v2 = False
    blocks = train_blocks(data_dir, len(files), manifest=manifest)
    try:
        if is_tar_shard(files[0]):  # WebDataset shards: the same columns as Parquet shards of encoded images
            ds = webdataset_stream(files, manifest.task, "train", blocks=blocks)
        else:
            ds = ray.data.read_parquet(files, override_num_blocks=blocks)
    finally:
        ctx.use_datasource_v2 = v2
    resources: dict[str, Any] = {} if num_cpus is None else {"num_cpus": num_cpus}
    if concurrency is not None:  # Ray 2.51+ names the task-pool cap `compute` (`concurrency` is deprecated)
        resources["compute"] = ray.data.TaskPoolStrategy(size=concurrency)
    return ds.select_columns(list(columns)).map_batches(transform, batch_format="numpy", **resources)


def train_streams(
    data_dir: str | Path,
    columns: Sequence[str],
    transform: Transform,
    epoch_transform: EpochViews | None,
    *,
    epochs: int,
    fraction: float = 1.0,
    seed: int = 0,
    num_cpus: float | None = None,
    concurrency: int | None = None,
    shards_at: str | None = None,
    manifest: Manifest | None = None,
) -> tuple[dict[str, Any], dict[str, PassViews] | None]:
    """The Ray Data datasets of a streamed train split by Ray Train dataset name (:func:`train_splits`), each
    :func:`train_dataset` of the :func:`train_subset` (``fraction``, ``seed``) of ``transform``. With an
    ``epoch_transform`` (encoded images, :class:`EpochViews`: the epoch's random views, caption draws, noisy
    labels), the tasks make it instead of ``transform``, told the epoch by a new :class:`EpochBoard` per
    dataset: the :class:`PassViews` are returned by the same names, for :class:`StreamedEpochs` (``views``).
    ``shards_at``: where the shards are read from (:func:`train_dataset`)."""
    datasets, views = {}, {} if epoch_transform is not None else None
    for name in train_splits(epochs):
        fn = transform
        if views is not None:
            fn = views[name] = PassViews(epoch_transform, EpochBoard.new())
        datasets[name] = train_dataset(
            data_dir,
            columns,
            train_transform(fn, fraction, seed),
            num_cpus=num_cpus,
            concurrency=concurrency,
            shards_at=shards_at,
            manifest=manifest,
        )
    return datasets, views


def stream_epoch(
    shard: Any,
    *,
    rows: int,
    shuffle_buffer: int,
    seed: int,
    epoch: int,
    rank: int,
    blocks: Iterable[Batch] | None = None,
) -> Iterator[Batch]:
    """This worker's full batches of ``rows`` rows of a streamed epoch: Ray Data hands over whole blocks and
    :func:`local_batches` cuts them, shuffled with a generator seeded by (seed, epoch, rank) when
    ``shuffle_buffer`` > 0. (Ray's own ``iter_batches(batch_size=rows, local_shuffle_buffer_size=…)`` took
    about 5× the worker's CPU per row.) ``blocks``: the epoch's blocks when already opened (else opened here)."""
    rng = np.random.default_rng((seed * 7919 + epoch) * 131 + rank) if shuffle_buffer > 0 else None
    if blocks is None:
        blocks = _open_blocks(shard)
    return local_batches(blocks, rows=rows, shuffle_buffer=shuffle_buffer, rng=rng)


def _open_blocks(shard: Any) -> Iterator[Batch]:
    """A new pass over the shard as whole numpy blocks."""
    return iter(shard.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=1))


class StreamedEpochs:
    """This worker's streamed epochs (:func:`stream_epoch`), each pass opened ahead in a background thread.

    Ray Data starts every pass with a new executor: about 0.3 s to the first block, then about a second of
    running one task at a time (Ray 2.60's autoscaling coordinator, `raydist bench data`). A split dataset
    runs one pass at a time (its coordinator ends the current pass when the next starts), so with one
    ``shards`` entry the next pass is opened when the current one's last block has arrived, and its start
    overlaps with what the loop does between epochs (validation, checkpoint). With two entries, two splits
    of the same dataset, epoch e streams from ``shards[e % 2]`` and epoch e + 1 is opened on the other one as
    soon as epoch e starts: the next pass's start overlaps with this whole epoch, whatever the loop does
    between them. Every epoch is still one full pass, split equally over the workers, and its batches are
    those of a pass opened on the spot. No pass is opened beyond ``epochs``.

    ``views`` (one :class:`PassViews` per shard, for streams whose Ray Data tasks make the per-epoch views): the
    epoch is announced on the shard's board before its pass is opened, every block's ``epoch`` column is
    checked against it and dropped, and each batch is finished (:meth:`PassViews.finish`)."""

    def __init__(
        self,
        shards: Sequence[Any],
        *,
        rows: int,
        shuffle_buffer: int,
        seed: int,
        rank: int,
        epochs: int,
        views: Sequence[PassViews] | None = None,
    ) -> None:
        if len(shards) not in (1, 2):
            raise ValueError(f"StreamedEpochs takes one split or two, got {len(shards)}")
        if views is not None and len(views) != len(shards):
            raise ValueError(f"one PassViews per split: {len(shards)} splits, {len(views)} views")
        self.shards, self.rows, self.shuffle_buffer, self.seed, self.rank = (
            list(shards),
            rows,
            shuffle_buffer,
            seed,
            rank,
        )
        self.epochs, self.views = epochs, views
        self._ahead: tuple[int, Future[Iterator[Batch]]] | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="raydist-next-epoch")

    def epoch(self, epoch: int) -> Iterator[Batch]:
        """The batches of ``epoch``; the pass of ``epoch + 1`` is opened ahead (see the class)."""
        ahead, self._ahead = self._ahead, None
        shard = self.shards[epoch % len(self.shards)]
        blocks = (
            ahead[1].result() if ahead is not None and ahead[0] == epoch else self._open(epoch, _open_blocks)
        )
        if len(self.shards) == 2:
            self._open_ahead(epoch + 1)
        else:
            blocks = self._then_open(blocks, epoch + 1)
        if self.views is not None:
            blocks = _checked_epoch(blocks, epoch)
        batches = stream_epoch(
            shard,
            rows=self.rows,
            shuffle_buffer=self.shuffle_buffer,
            seed=self.seed,
            epoch=epoch,
            rank=self.rank,
            blocks=blocks,
        )
        return batches if self.views is None else map(self.views[epoch % len(self.shards)].finish, batches)

    def _open(self, epoch: int, opener: Callable[[Any], Iterator[Batch]]) -> Iterator[Batch]:
        """``opener(shard)`` for ``epoch``'s pass, the epoch announced first when the tasks need it."""
        index = epoch % len(self.shards)
        if self.views is not None:
            self.views[index].board.announce(epoch)
        return opener(self.shards[index])

    def _then_open(self, blocks: Iterator[Batch], epoch: int) -> Iterator[Batch]:
        yield from blocks
        self._open_ahead(epoch)

    def _open_ahead(self, epoch: int) -> None:
        if epoch < self.epochs:
            self._ahead = (epoch, self._pool.submit(self._open, epoch, _first_block_fetched))


def _checked_epoch(blocks: Iterable[Batch], epoch: int) -> Iterator[Batch]:
    """``blocks`` without their ``epoch`` column, once it says every row's views were made for ``epoch``."""
    for block in blocks:
        made = block.pop(EPOCH_COLUMN, None)
        if made is None or len(made) and (made.min() != epoch or made.max() != epoch):
            found = "no epoch column" if made is None else f"views of epoch(s) {sorted(set(made.tolist()))}"
            raise RuntimeError(
                f"streamed pass of epoch {epoch} delivered {found}: the Ray Data tasks and the "
                "training workers disagree on the epoch"
            )
        yield block


def _first_block_fetched(shard: Any) -> Iterator[Batch]:
    """A new pass over ``shard`` with its first block already requested."""
    blocks = _open_blocks(shard)
    first = next(blocks, None)
    return blocks if first is None else chain([first], blocks)


def local_batches(
    blocks: Iterable[Batch], *, rows: int, shuffle_buffer: int, rng: np.random.Generator | None
) -> Iterator[Batch]:
    """Full batches of ``rows`` rows cut from a stream of column blocks; the last < ``rows`` rows are left out.

    Without ``rng`` rows keep their order. With it this is a local shuffle buffer: every batch is ``rows``
    rows drawn uniformly without replacement from the rows that have arrived and not left, drawn only while
    at least ``shuffle_buffer`` rows stay behind (until the stream ends). The draws between two blocks are
    consecutive slices of one permutation of the buffer: the same distribution as drawing them one by one,
    for one gather per block instead of one per batch. Memory: the rows carried over (fewer than
    ``shuffle_buffer + rows``) and one block, twice while a block is added and permuted."""
    pool: Batch = {}
    for block in chain(blocks, [None]):
        if block is not None:
            pool = block if not pool else {k: np.concatenate([v, block[k]]) for k, v in pool.items()}
        n = len(next(iter(pool.values()), ()))
        draws = n // rows if block is None or rng is None else max(0, (n - shuffle_buffer) // rows)
        if not draws:
            continue
        if rng is not None:
            order = rng.permutation(n)
            pool = {k: v[order] for k, v in pool.items()}
        yield from ({k: v[i * rows : (i + 1) * rows] for k, v in pool.items()} for i in range(draws))
        pool = {k: v[draws * rows :] for k, v in pool.items()}
