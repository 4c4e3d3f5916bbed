"""A dataset's database side embedded at corpus scale (``raydist index --num-workers N``): Ray Data hands the
dataset's Parquet shards (local or a URI) to an actor pool that holds the model; each shard becomes one Parquet
file of ids and full-width vectors, written under a temporary name and renamed, so a killed run re-embeds only
the shards without one; then the FAISS indexes over all of them."""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raydist import uris
from raydist.config import ConfigError
from raydist.console import say
from raydist.data.image_transforms import decode_image
from raydist.data.manifest import manifest_from_dict
from raydist.data.schema import IMAGE, IMAGE_ID, SAMPLE_ID, SPLITS
from raydist.data.shards import feature_matrix
from raydist.dataset_task import MANIFEST_NAME
from raydist.retrieval.budget import IndexBudget, write_budget_index
from raydist.retrieval.index import build_indexes
from raydist.retrieval.sets import RetrievalSet
from raydist.retrieval.trained import ALL_SPLITS, Trained, load_trained

EMBEDDINGS = "embeddings"  # the folder of embedding shards inside an index folder
EMBEDDINGS_META = "embeddings.json"  # whose embeddings they are: the model's fingerprint, dataset and splits
ID, VECTOR = "id", "vector"  # the columns of an embedding shard


@dataclass(frozen=True)
class Shard:
    """One input shard of a split: its file relative to the dataset and its rows."""

    split: str
    file: str
    rows: int

    @property
    def output(self) -> str:
        """Its embedding shard, relative to the index folder: ``embeddings/<split>/<shard name>.parquet``."""
        return f"{EMBEDDINGS}/{self.split}/{Path(self.file).stem}.parquet"


def model_fingerprint(trained: Trained) -> str:
    """sha256 over the model's tensors (names, shapes, dtypes and bytes): which model made a set of vectors."""
    digest = hashlib.sha256()
    for name, tensor in sorted(trained.model.state_dict().items()):
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def dataset_shards(data: str, split: str) -> tuple[list[Shard], dict[str, Any]]:
    """The shards of ``split`` (``all``: every split, in order) of the dataset at ``data`` (a folder or URI),
    from its manifest, and the manifest as a dict."""
    raw = json.loads(uris.read_bytes(uris.join(data, MANIFEST_NAME)))
    manifest = manifest_from_dict(raw, uris.join(data, MANIFEST_NAME))
    splits = list(SPLITS) if split == ALL_SPLITS else [split]
    if split != ALL_SPLITS and split not in SPLITS:
        raise ValueError(f"split {split!r}: expected one of {', '.join(SPLITS)} or {ALL_SPLITS!r}")
    shards = [Shard(s, sh.file, sh.rows) for s in splits for sh in manifest.splits[s].shards]
    return shards, raw


def shard_vectors(trained: Trained, table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(dataset ids, float32 vectors at the full dim) of one shard's database rows, computed as the task
    embeds a split: ``pairs`` each image once (its first row in the shard, ``image_id``), ``labels`` every row
    (``sample_id``)."""
    task, model, device = trained.task, trained.model, trained.device
    if task.name == "pairs":
        ids = table.column(IMAGE_ID).to_numpy()
        _, first = np.unique(ids, return_index=True)
        first = np.sort(first)
    else:
        ids = table.column(SAMPLE_ID).to_numpy()
        first = np.arange(len(ids))
    if trained.data_info.encoded:
        images = table.column(IMAGE).to_pylist()
        channels = trained.data_info.image_channels or 3
        vectors = task.embed_images(model, [decode_image(images[i], channels) for i in first], device)
    else:
        vectors = task.embed_features(model, feature_matrix(table.column(IMAGE))[first], device)
    return ids[first].astype(np.int64), vectors.numpy().astype(np.float32, copy=False)


def write_vectors(location: str, ids: np.ndarray, vectors: np.ndarray) -> None:
    """An embedding shard at ``location``: written under a temporary name beside it, then renamed (a reader,
    or a resumed run, sees a whole file or none)."""
    dim = vectors.shape[1]
    table = pa.table(
        {
            ID: pa.array(ids, pa.int64()),
            VECTOR: pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), dim),
        }
    )
    fs, path = uris.filesystem(location)
    folder, name = path.rsplit("/", 1)
    fs.create_dir(folder, recursive=True)
    temporary = f"{folder}/.{name}.{uuid.uuid4().hex}.tmp"
    pq.write_table(table, temporary, filesystem=fs)
    fs.move(temporary, path)


def read_vectors(location: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors [N, D]) of an embedding shard."""
    fs, path = uris.filesystem(location)
    table = pq.read_table(path, filesystem=fs)
    return table.column(ID).to_numpy(), feature_matrix(table.column(VECTOR))


class ShardEmbedder:
    """The actor pool's callable class: loads the checkpoint once per actor, then embeds whole shards (one
    shard per Ray Data row) and writes each one's embedding shard."""

    def __init__(self, checkpoint: str, data: str, out: str, device: str) -> None:
        self.trained = load_trained(checkpoint, need_data=False, device=device)
        self.data, self.out = data, out

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows, seconds = [], []
        for file, output in zip(batch["file"], batch["output"], strict=True):
            start = time.perf_counter()
            fs, path = uris.filesystem(uris.join(self.data, str(file)))
            ids, vectors = shard_vectors(self.trained, pq.read_table(path, filesystem=fs))
            write_vectors(uris.join(self.out, str(output)), ids, vectors)
            rows.append(len(ids))
            seconds.append(time.perf_counter() - start)
        return {"file": batch["file"], "rows": np.array(rows), "seconds": np.array(seconds)}


def _identity(trained: Trained, data: str, split: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """What an embeddings folder records of its vectors' origin (:data:`EMBEDDINGS_META`)."""
    shards = [sh["sha256"] for s in manifest["splits"].values() for sh in s["shards"]]
    return {
        "checkpoint": str(trained.checkpoint_path),
        "model_sha256": model_fingerprint(trained),
        "dataset": str(data),
        "dataset_shards_sha256": hashlib.sha256("".join(shards).encode()).hexdigest(),
        "split": split,
        "task": trained.task.name,
        "dim": trained.config.model.embed_dim,
    }


def check_embeddings_folder(out: str, identity: dict[str, Any]) -> None:
    """Refuse (one line, nothing written) an index folder whose embeddings were made by another model, of
    another dataset or split; a folder without them is fine."""
    location = uris.join(out, EMBEDDINGS, EMBEDDINGS_META)
    if uris.file_type(location) != "file":
        if uris.list_folder(uris.join(out, EMBEDDINGS)):
            raise ConfigError(
                f"{uris.join(out, EMBEDDINGS)}: holds files but no {EMBEDDINGS_META}; not raydist's "
                "embeddings: give another --out"
            )
        return
    saved = json.loads(uris.read_bytes(location))
    for key, what in (
        ("model_sha256", "another model"),
        ("dataset_shards_sha256", "another dataset"),
        ("split", "another split"),
    ):
        if saved.get(key) != identity[key]:
            raise ConfigError(
                f"{uris.join(out, EMBEDDINGS)}: holds the embeddings of {what} (checkpoint {saved.get('checkpoint')}, "
                f"split {saved.get('split')}), not of checkpoint {identity['checkpoint']} split {identity['split']}; "
                "nothing was overwritten: give another --out"
            )


def claim_embeddings_folder(trained: Trained, data: str, out: str, split: str) -> list[Shard]:
    """The shards of ``split`` of ``data``, after checking that ``out/embeddings`` holds nothing but this model's
    embeddings of them (:func:`check_embeddings_folder`) and recording that it does (:data:`EMBEDDINGS_META`)."""
    shards, manifest = dataset_shards(data, split)
    if manifest.get("task") != trained.task.name:
        raise ConfigError(
            f"dataset {data} is a {manifest.get('task')!r} dataset, the checkpoint a {trained.task.name!r} model"
        )
    identity = _identity(trained, data, split, manifest)
    check_embeddings_folder(out, identity)
    uris.write_bytes(uris.join(out, EMBEDDINGS, EMBEDDINGS_META), json.dumps(identity, indent=1).encode())
    return shards


def embed_corpus(
    checkpoint: str | Path,
    out: str,
    data: str | None = None,
    *,
    split: str = "test",
    num_workers: int = 2,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
    address: str | None = None,
) -> tuple[Trained, list[Shard], int]:
    """Embed the database rows of ``split`` of the checkpoint's dataset (or ``data``) into ``out/embeddings``
    with ``num_workers`` Ray Data actors; shards whose embedding shard exists are skipped. Returns the driver's
    loaded model, every shard and how many were embedded now."""
    from raydist.runtime import init_ray

    if num_workers < 1:
        raise ValueError(f"--num-workers {num_workers}: expected >= 1")
    trained = load_trained(checkpoint, need_data=False)
    if data is None:
        if trained.data_info.data_dir is None:
            raise ConfigError(f"checkpoint {trained.checkpoint_path}: its dataset is gone; give --data DIR")
        data = str(trained.data_info.data_dir)
    data = data if uris.is_uri(data) else str(Path(data).resolve())
    out = out if uris.is_uri(out) else str(Path(out).resolve())
    shards = claim_embeddings_folder(trained, data, out, split)
    done = {
        f"{EMBEDDINGS}/{s}/{name}" for s in SPLITS for name in uris.list_folder(uris.join(out, EMBEDDINGS, s))
    }
    todo = [s for s in shards if s.output not in done]
    say(
        f"embedding {len(todo)} of {len(shards)} shards ({len(shards) - len(todo)} done before) with "
        f"{num_workers} Ray Data actor{'s' if num_workers > 1 else ''}"
    )
    if todo:
        init_ray(num_workers * cpus_per_worker + 1, address, dashboard=False)
        _run_pool(trained, data, out, todo, num_workers, cpus_per_worker, gpus_per_worker)
    return trained, shards, len(todo)


def _run_pool(
    trained: Trained,
    data: str,
    out: str,
    todo: Sequence[Shard],
    num_workers: int,
    cpus_per_worker: float,
    gpus_per_worker: float,
) -> None:
    """The Ray Data pipeline: one row per shard → the actor pool → one line of progress per finished shard."""
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    items = [{"file": s.file, "output": s.output} for s in todo]
    ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        ShardEmbedder,
        batch_size=1,
        compute=ray.data.ActorPoolStrategy(size=min(num_workers, len(todo))),
        fn_constructor_args=(str(trained.checkpoint_path), data, out, "cuda" if gpus_per_worker else "cpu"),
        num_cpus=cpus_per_worker,
        num_gpus=gpus_per_worker or None,
    )
    total_rows = sum(s.rows for s in todo)
    start, rows = time.perf_counter(), 0
    for count, row in enumerate(ds.iter_rows(), 1):
        rows += int(next(s.rows for s in todo if s.file == row["file"]))
        elapsed = time.perf_counter() - start
        eta = elapsed / rows * (total_rows - rows) if rows else float("nan")
        say(
            f"  shard {count}/{len(todo)} {row['file']}: {int(row['rows'])} vectors in {row['seconds']:.1f} s; "
            f"{rows / elapsed:.0f} input rows/s, ETA {eta:.0f} s"
        )


def corpus_set(trained: Trained, out: str, shards: Sequence[Shard], split: str) -> RetrievalSet:
    """Every embedding shard of ``shards`` read back in dataset order as one database (an image in two
    shards kept once, at its first appearance: the order one process embeds a split in)."""
    parts = [read_vectors(uris.join(out, s.output)) for s in shards]
    ids = np.concatenate([p[0] for p in parts])
    vectors = np.concatenate([p[1] for p in parts])
    _, first = np.unique(ids, return_index=True)
    first = np.sort(first)
    ids, vectors = ids[first], vectors[first]
    empty = np.zeros(0, dtype=np.int64)
    return RetrievalSet(
        trained.task.name,
        "t2i" if trained.task.name == "pairs" else "knn",
        vectors,
        vectors[:0],
        np.arange(len(ids)),
        empty,
        ids,
        empty,
        two_way=trained.task.name == "pairs",
        source=str(trained.checkpoint_path),
        split="+".join(SPLITS) if split == ALL_SPLITS else split,
    )


def index_corpus(
    checkpoint: str | Path,
    out: str,
    data: str | None = None,
    *,
    split: str = "test",
    dims: Sequence[int] | None = None,
    kind: str = "flat",
    num_workers: int = 2,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
    address: str | None = None,
    budget: IndexBudget | None = None,
    **index_options: Any,
) -> tuple[RetrievalSet, list[int]]:
    """:func:`embed_corpus`, then the indexes at :meth:`Trained.retrieval_dims` over the embedding shards
    (:func:`raydist.retrieval.index.build_indexes`; with ``budget`` the one index chosen under it) in ``out``
    (a URI: built locally, then copied there)."""
    trained, shards, _ = embed_corpus(
        checkpoint,
        out,
        data,
        split=split,
        num_workers=num_workers,
        cpus_per_worker=cpus_per_worker,
        gpus_per_worker=gpus_per_worker,
        address=address,
    )
    out = out if uris.is_uri(out) else str(Path(out).resolve())
    rset, dims = corpus_set(trained, out, shards, split), trained.retrieval_dims(dims)

    def write(folder: str) -> list[int]:
        if budget is not None:
            return [write_budget_index(rset, dims, budget, folder, progress=say).best.dim]
        build_indexes(rset, dims, kind, folder, **index_options)
        return list(dims)

    if not uris.is_uri(out):
        return rset, write(out)
    with tempfile.TemporaryDirectory(prefix="raydist-index-") as tmp:
        written = write(tmp)
        for file in Path(tmp).iterdir():
            uris.write_bytes(uris.join(out, file.name), file.read_bytes())
    return rset, written
