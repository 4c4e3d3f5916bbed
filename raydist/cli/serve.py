"""``raydist serve``: a trained model and its FAISS index behind HTTP with Ray Serve (:mod:`raydist.serving`)."""

from __future__ import annotations

import argparse

from raydist.cli.common import Command, add_latest


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist serve``."""
    p.add_argument(
        "checkpoint", metavar="RUN_OR_CHECKPOINT", help="run folder (its best checkpoint) or checkpoint"
    )
    p.add_argument(
        "--index",
        default="all",
        help="what /search searches: a split of the checkpoint's dataset (train, val, test), all (default), "
        "or a folder `raydist index` wrote",
    )
    p.add_argument(
        "--data", help="dataset folder of --index SPLIT (default: the one the checkpoint was trained on)"
    )
    add_latest(p)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (0.0.0.0: every interface; without --api-key-env a warning)",
    )
    p.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="require 'Authorization: Bearer <key>' on every route but /health (401 without it), the key being "
        "the value of the environment variable VAR",
    )
    p.add_argument(
        "--max-requests-per-s",
        type=int,
        metavar="N",
        help="at most N requests in any second from one client address, per replica (429 beyond; /health free)",
    )
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--replicas", type=int, default=1, help="model replicas (scale out on a cluster)")
    p.add_argument("--replica-cpus", type=float, default=0.5, help="logical CPUs reserved per replica")
    p.add_argument("--max-items", type=int, default=256, help="most inputs in one request")
    p.add_argument("--max-body-mb", type=float, default=8.0, help="largest request body, MiB")
    p.add_argument("--max-batch", type=int, default=16, help="most requests answered in one batch")
    p.add_argument(
        "--batch-wait-ms",
        type=float,
        default=0.0,
        help="how long an idle replica's first request waits for others (0: none; a batch takes the requests "
        "waiting when the last one ends)",
    )
    p.add_argument("--shortlist", type=int, default=200, help="adaptive/funnel search: first shortlist size")
    p.add_argument(
        "--address", help="deploy on this Ray cluster (default: RAY_ADDRESS, else a private local Ray)"
    )


def run(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C."""
    from raydist.serving.access import AccessRules
    from raydist.serving.deployment import serve_until_stopped
    from raydist.serving.service import ServeOptions

    options = ServeOptions(
        max_items=args.max_items,
        max_body_bytes=round(args.max_body_mb * 2**20),
        max_batch=args.max_batch,
        batch_wait_s=args.batch_wait_ms / 1e3,
        shortlist=args.shortlist,
    )
    return serve_until_stopped(
        checkpoint=args.checkpoint,
        index=args.index,
        data_dir=args.data,
        latest=args.latest,
        host=args.host,
        port=args.port,
        replicas=args.replicas,
        replica_cpus=args.replica_cpus,
        options=options,
        access=AccessRules.from_env(args.api_key_env, args.max_requests_per_s),
        address=args.address,
        log_level="INFO" if args.verbose else "WARNING",
    )


SERVE = Command(
    "serve",
    "serve a trained model and its FAISS index over HTTP with Ray Serve: /embed, /search, /health",
    add_arguments,
    run,
)
