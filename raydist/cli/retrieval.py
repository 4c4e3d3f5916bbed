"""``raydist index``, ``raydist search`` and ``raydist retrieve``: FAISS indexes of a checkpoint's embeddings,
queries against them, and the retrieval report (per dim, adaptive, funnel, cost, baselines)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from raydist.cli.common import Command, dims
from raydist.cli.evaluate import add_checkpoint_options
from raydist.console import say

_DIMS_HELP = "comma-separated prefix dims (default: the trained model.nesting, else 8,16,…,D)"


def add_index_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist index``."""
    add_checkpoint_options(p)
    p.add_argument("--split", default="test", help="train, val, test, or all (every split, one index)")
    p.add_argument("--dims", help=_DIMS_HELP)
    p.add_argument("--kind", default="flat", choices=["flat", "hnsw"], help="index type (inner product)")
    p.add_argument("--hnsw-m", type=int, default=32, help="HNSW graph degree M")
    p.add_argument("--out", required=True, help="folder (or URI) for the index files and indexes.json")
    p.add_argument(
        "--num-workers",
        type=int,
        help="embed the dataset's shards with this many Ray Data actors, one embedding shard per input shard in "
        "OUT/embeddings (resumable: finished shards are kept), then index them",
    )
    p.add_argument(
        "--memory-budget",
        help="one index of at most this size (64KB, 2GB; KB = 1024 bytes): the prefix dim, index type and its "
        "search parameter chosen together (with --min-recall)",
    )
    p.add_argument(
        "--min-recall",
        type=float,
        help="with --memory-budget: the recall@10 of exact search it must reach on held-out queries, in (0, 1]",
    )
    p.add_argument("--cpus-per-worker", type=float, default=1.0, help="with --num-workers: CPUs per actor")
    p.add_argument("--gpus-per-worker", type=float, default=0.0, help="with --num-workers: GPUs per actor")
    p.add_argument(
        "--address",
        help="with --num-workers: the Ray cluster to run on (default: RAY_ADDRESS, else a private Ray)",
    )


def run_index(args: argparse.Namespace) -> int:
    """Write the indexes of the chosen checkpoint's embeddings."""
    from raydist.retrieval.trained import choose_trained, write_checkpoint_indexes

    chosen = choose_trained(args.checkpoint, latest=args.latest)
    say(f"checkpoint {chosen}")
    common = {"split": args.split, "dims": dims(args.dims), "kind": args.kind, "hnsw_m": args.hnsw_m}
    label = f"{args.kind} indexes at"
    if (args.memory_budget is None) != (args.min_recall is None):
        raise ValueError("give --memory-budget SIZE and --min-recall R together")
    if args.memory_budget is not None:
        from raydist.retrieval.budget import IndexBudget, parse_size

        if not 0 < args.min_recall <= 1:
            raise ValueError(
                f"--min-recall {args.min_recall}: expected 0 < R <= 1 (recall@10 of exact search)"
            )
        common["budget"] = IndexBudget(parse_size(args.memory_budget), args.min_recall)
        label = "one index chosen under the budget:"
    where = args.out
    if args.num_workers is None:
        rset, written = write_checkpoint_indexes(chosen.path, args.out, args.data, **common)
    else:
        from raydist.retrieval.corpus import index_corpus

        workers = {"num_workers": args.num_workers, "cpus_per_worker": args.cpus_per_worker}
        workers.update(gpus_per_worker=args.gpus_per_worker, address=args.address)
        rset, written = index_corpus(chosen.path, args.out, args.data, **common, **workers)
        where = f"{args.out} (embedding shards in {args.out}/embeddings)"
    say(f"wrote {label} dims {written} of {rset.database.shape[0]} vectors ({rset.split}) to {where}")
    return 0


def add_search_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist search``."""
    p.add_argument("--index", required=True, help="folder `raydist index --out` wrote")
    p.add_argument("--query", help="one text query (pairs: a caption; its top-k images)")
    p.add_argument(
        "--queries", help="a file of queries: one text per line, or a .npy of feature vectors [N, D]"
    )
    p.add_argument("--k", type=int, default=10, help="results per query")
    p.add_argument("--dim", type=int, help="search the index at this prefix dim (default: its largest)")
    p.add_argument(
        "--checkpoint", help="embed the queries with this checkpoint (default: the one the index records)"
    )
    p.add_argument(
        "--data",
        help="the indexed dataset, to show what each hit is (default: the one the index's checkpoint was "
        "trained on)",
    )
    p.add_argument("--json", action="store_true", help="print the queries and their hits as one JSON object")


def run_search(args: argparse.Namespace) -> int:
    """Embed the queries and print each one's top k with what the dataset holds for it (split, captions,
    class), or all of it as JSON with ``--json``."""
    from raydist.checkpoint import recorded_dataset
    from raydist.cli.search_results import dataset_rows, hit_line, hits, indexed_splits, search_report
    from raydist.config import ConfigError
    from raydist.retrieval.query import read_queries, search_index

    if (args.query is None) == (args.queries is None):
        raise ValueError("give one of --query TEXT or --queries FILE")
    queries = [args.query] if args.query is not None else read_queries(args.queries)
    result = search_index(args.index, queries, k=args.k, dim=args.dim, checkpoint=args.checkpoint)
    meta = result.meta
    try:
        data_dir = str(recorded_dataset(meta["checkpoint"], args.data))
    except ConfigError:  # the dataset is gone: the ids and scores are still the answer
        data_dir = None
    rows = dataset_rows(data_dir, meta["task"], indexed_splits(meta)) if data_dir else None
    found = hits(result.ids, result.scores, rows)
    if args.json:
        report = search_report(
            queries,
            found,
            index=args.index,
            meta=meta,
            dim=result.dim,
            checkpoint=str(result.checkpoint.path),
            data_dir=data_dir,
        )
        say(json.dumps(report, ensure_ascii=False))
        return 0
    say(
        f"index {args.index}: {len(meta['database_ids'])} {meta['task']} vectors of {meta['split']}, dim {result.dim}; "
        f"queries embedded by {result.checkpoint.path}"
    )
    key = "image_id" if meta["task"] == "pairs" else "sample_id"
    say(
        f"hits: rank, {key}, cosine score, split and what the dataset holds ({data_dir})"
        if data_dir
        else f"hits: rank, {key}, cosine score (the indexed dataset is gone; --data DIR shows what they are)"
    )
    for q, query_hits in enumerate(found):
        say(f"query {q}: {queries[q]!r}" if isinstance(queries, list) else f"query {q}")
        for hit in query_hits:
            say(hit_line(hit))
    return 0


def add_retrieve_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist retrieve``."""
    add_checkpoint_options(p)
    p.add_argument("--split", default="test")
    p.add_argument("--dims", help=_DIMS_HELP)
    p.add_argument("--kind", default="flat", choices=["flat", "hnsw", "ivf-prefix"], help="index type")
    p.add_argument("--shortlist", type=int, default=200, help="adaptive retrieval: shortlist size at D_s")
    p.add_argument("--funnel", help="funnel cascade DIMS:SHORTLISTS, e.g. 16,32,64,128:200,100,50")
    p.add_argument("--baseline", help="a non-nested checkpoint: first-m / SVD / random-projection baselines")
    p.add_argument("--k", type=int, default=10, help="neighbours retrieved (P@k, mAP@k for labels)")
    p.add_argument("--out", help="folder for the table, JSON rows and PNG plots")


def run_retrieve(args: argparse.Namespace) -> int:
    """Print the retrieval report of the chosen checkpoint (and the files it wrote)."""
    from raydist.retrieval.trained import checkpoint_retrieval_report, choose_trained

    chosen = choose_trained(args.checkpoint, latest=args.latest)
    say(f"checkpoint {chosen}")
    funnel = None
    if args.funnel:
        stages, _, sizes = args.funnel.partition(":")
        funnel = (dims(stages), dims(sizes))
    report = checkpoint_retrieval_report(
        chosen.path,
        args.data,
        split=args.split,
        dims=dims(args.dims),
        kind=args.kind,
        baseline_checkpoint=args.baseline,
        out_dir=args.out,
        shortlist=args.shortlist,
        funnel=funnel,
        k=args.k,
    )
    say(report["table"])
    for path in report["files"]:
        say(f"wrote {Path(args.out) / path}")
    return 0


INDEX = Command(
    "index", "build FAISS indexes of a checkpoint's embeddings at nested dims", add_index_arguments, run_index
)
SEARCH = Command(
    "search",
    "search an index built by `raydist index` with texts or feature vectors",
    add_search_arguments,
    run_search,
)
RETRIEVE = Command(
    "retrieve",
    "retrieval per dim, adaptive and funnel retrieval, cost, baselines",
    add_retrieve_arguments,
    run_retrieve,
)
