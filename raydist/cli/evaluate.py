"""``raydist eval``: a checkpoint's metrics on a split (the VSE++ protocol for pairs)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from raydist.cli.common import Command, add_latest
from raydist.console import say


def add_checkpoint_options(p: argparse.ArgumentParser) -> None:
    """``--checkpoint`` (required), ``--latest`` and ``--data``: what eval, index and retrieve read."""
    p.add_argument(
        "--checkpoint", required=True, help="checkpoint folder or run folder (its best checkpoint)"
    )
    add_latest(p)
    p.add_argument("--data", help="dataset folder (default: the dataset the checkpoint was trained on)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist eval``."""
    add_checkpoint_options(p)
    p.add_argument("--split", default="test", help="split to evaluate: train, val or test")
    p.add_argument(
        "--folds", type=int, default=None, help="5 = COCO 1K protocol (default: checkpoint config)"
    )
    p.add_argument(
        "--num-workers",
        type=int,
        default=1,
        help="processes that embed the split together, each a share of its batches (the metrics are the same)",
    )
    p.add_argument("--json", help="write the metrics to this JSON file")


def run(args: argparse.Namespace) -> int:
    """Evaluate the chosen checkpoint and print (and optionally write) its metrics."""
    from raydist.eval.metrics import format_metrics
    from raydist.retrieval.trained import choose_trained, evaluate_checkpoint

    chosen = choose_trained(args.checkpoint, latest=args.latest)
    metrics = evaluate_checkpoint(
        chosen.path, args.data, args.split, folds=args.folds, workers=args.num_workers
    )
    say(f"{args.split} split, checkpoint {chosen}" + (f", {args.folds} folds" if args.folds else ""))
    say(format_metrics(metrics))
    if args.json:
        Path(args.json).write_text(json.dumps(metrics, indent=2))
        say(f"metrics written to {args.json}")
    return 0


EVAL = Command("eval", "evaluate a checkpoint with the VSE++ retrieval protocol", add_arguments, run)
