"""raydist.retrieval.corpus (``raydist index --num-workers N``): shards embedded by a Ray Data actor pool, one
embedding shard per input shard; the same vectors (float32, within 1e-6) and search answers as one process; a
resumed run re-embeds only the shards without an output; another model's folder refused, nothing overwritten."""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from object_store import upload

from raydist.config import ConfigError
from raydist.data import make_synthetic
from raydist.retrieval.corpus import (
    EMBEDDINGS,
    Shard,
    ShardEmbedder,
    claim_embeddings_folder,
    dataset_shards,
    embed_corpus,
    index_corpus,
    read_vectors,
)
from raydist.retrieval.query import search_index
from raydist.retrieval.trained import load_trained, write_checkpoint_indexes
from raydist.uris import list_folder

TOLERANCE = 1e-6  # max |Δ| of a vector entry against one process (float32; other batch boundaries)


def test_every_shard_has_one_output_named_after_it(tmp_path):
    data = make_synthetic(tmp_path / "d", images=30, captions_per_image=5, dim=8, seed=0, rows_per_shard=40)
    shards, _ = dataset_shards(str(data), "all")
    outputs = [s.output for s in shards]
    assert len(set(outputs)) == len(shards) > 3
    assert Shard("val", "val/part-00001.parquet", 3).output == f"{EMBEDDINGS}/val/part-00001.parquet"


@pytest.mark.slow
def test_actor_pool_embeds_resumes_and_refuses_another_model(ray_cluster, tmp_path, fresh_checkpoint):
    data = make_synthetic(tmp_path / "d", images=60, captions_per_image=5, dim=16, seed=0, rows_per_shard=40)
    ckpt = fresh_checkpoint(tmp_path / "run" / "checkpoint_00000001", data)
    out = tmp_path / "index"
    workers = {"num_workers": 2, "cpus_per_worker": 0.5}
    rset, dims = index_corpus(ckpt, str(out), split="all", **workers)
    shards, _ = dataset_shards(str(data), "all")
    files = sorted((out / EMBEDDINGS).rglob("*.parquet"))
    assert len(files) == len(shards) and not list((out / EMBEDDINGS).rglob("*.tmp"))

    # the same vectors and ids as one process, and the same search answers
    one = load_trained(ckpt).embed("all")
    assert np.array_equal(rset.database_ids, one.database_ids)
    assert np.abs(rset.database - one.database).max() <= TOLERANCE
    write_checkpoint_indexes(ckpt, tmp_path / "single", split="all")
    captions = ["a white child sitting in the park", "a red car on the road", "a dog"]
    for dim in dims:
        got = search_index(out, captions, k=5, dim=dim)
        want = search_index(tmp_path / "single", captions, k=5, dim=dim)
        assert np.array_equal(got.ids, want.ids) and np.allclose(got.scores, want.scores, atol=1e-5)

    # resume: a removed output is embedded again, the others are not recomputed (a marked file stays as it is)
    kept, removed = out / shards[0].output, out / shards[-1].output
    ids, vectors = read_vectors(str(kept))
    pq.write_table(pq.read_table(kept).replace_schema_metadata({"marker": "kept"}), kept)
    stamp = {f: os.stat(f).st_mtime_ns for f in files if f not in (kept, removed)}
    removed.unlink()
    _, _, embedded = embed_corpus(ckpt, str(out), split="all", **workers)
    assert embedded == 1 and removed.exists()
    assert pq.read_schema(kept).metadata == {b"marker": b"kept"}
    assert stamp == {f: os.stat(f).st_mtime_ns for f in stamp}
    assert np.array_equal(read_vectors(str(kept))[1], vectors)

    # another checkpoint into the same folder: one line naming the problem, nothing written
    other = fresh_checkpoint(tmp_path / "other" / "checkpoint_00000001", data, seed=1)
    before = {f: f.read_bytes() for f in out.rglob("*") if f.is_file()}
    with pytest.raises(ConfigError, match="another model") as refused:
        index_corpus(other, str(out), split="all", **workers)
    assert "\n" not in str(refused.value)
    assert before == {f: f.read_bytes() for f in out.rglob("*") if f.is_file()}


def test_shards_on_s3_embedded_by_the_actor_class_are_kept_and_indexed_there(
    s3_server, tmp_path, fresh_checkpoint
):
    """No Ray: the actor class run in this process writes every embedding shard to S3 (temporary name, then
    renamed); ``index_corpus`` then finds every shard done, starts nothing, and writes the index next to them."""
    local = make_synthetic(tmp_path / "d", images=30, captions_per_image=2, dim=8, seed=0, rows_per_shard=20)
    data = upload(local, s3_server.create_bucket("corpus-data") + "/syn")
    out = s3_server.create_bucket("corpus-index") + "/idx"
    ckpt = fresh_checkpoint(tmp_path / "run" / "checkpoint_00000001", local)
    shards = claim_embeddings_folder(load_trained(ckpt), data, out, "all")  # as embed_corpus does first
    actor = ShardEmbedder(str(ckpt), data, out, "cpu")
    done = actor({"file": np.array([s.file for s in shards]), "output": np.array([s.output for s in shards])})
    one = load_trained(ckpt).embed("all")
    assert done["rows"].sum() == len(one.database)  # every image once
    rset, dims = index_corpus(ckpt, out, data, split="all", num_workers=2)  # nothing left to embed: no Ray
    assert np.array_equal(rset.database_ids, one.database_ids)
    assert np.abs(rset.database - one.database).max() <= TOLERANCE
    assert {f"index_d{d}.faiss" for d in dims} | {"indexes.json"} <= set(list_folder(out))
    assert not [
        n
        for s in ("train", "val", "test")
        for n in list_folder(f"{out}/{EMBEDDINGS}/{s}")
        if n.endswith(".tmp")
    ]
