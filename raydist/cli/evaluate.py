"""``raydist eval``: a checkpoint's metrics on a split (the VSE++ protocol for pairs)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from raydist.cli.common import Command, add_latest
from raydist.console import say

if TYPE_CHECKING:
    from raydist.checkpoint import ChosenCheckpoint


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
    p.add_argument(
        "--zero-shot",
        metavar="CLASSNAMES",
        help="a pairs model classifying a labelled dataset's images (--data): class names, one a line in a file "
        "or a,b,c (class 0 first); prints CLIP_benchmark's acc1, acc5, mean_per_class_recall",
    )
    p.add_argument(
        "--template",
        action="append",
        help='with --zero-shot: a prompt with {} for the class name (repeat for an ensemble; default "a photo of a {}.")',
    )
    p.add_argument("--json", help="write the metrics to this JSON file")


def run(args: argparse.Namespace) -> int:
    """Evaluate the chosen checkpoint and print (and optionally write) its metrics."""
    from raydist.retrieval.trained import choose_trained, evaluate_checkpoint

    chosen = choose_trained(args.checkpoint, latest=args.latest)
    if args.zero_shot is not None:
        return run_zero_shot(args, chosen)
    metrics = evaluate_checkpoint(
        chosen.path, args.data, args.split, folds=args.folds, workers=args.num_workers
    )
    say(f"{args.split} split, checkpoint {chosen}" + (f", {args.folds} folds" if args.folds else ""))
    return report(metrics, args.json)


def report(metrics: dict[str, float], json_path: str | None) -> int:
    """Print the metrics (and write them to ``json_path``)."""
    from raydist.eval.metrics import format_metrics

    say(format_metrics(metrics))
    if json_path:
        Path(json_path).write_text(json.dumps(metrics, indent=2))
        say(f"metrics written to {json_path}")
    return 0


def run_zero_shot(args: argparse.Namespace, chosen: ChosenCheckpoint) -> int:
    """``--zero-shot``: the chosen pairs checkpoint as a classifier of ``--data``'s images."""
    from raydist.retrieval.zero_shot import DEFAULT_TEMPLATE, class_names, zero_shot_eval

    if args.data is None:
        raise ValueError("--zero-shot: give --data DIR, the labelled dataset whose images it classifies")
    templates = args.template or [DEFAULT_TEMPLATE]
    names = class_names(args.zero_shot)
    metrics = zero_shot_eval(chosen.path, args.data, names, split=args.split, templates=templates)
    say(
        f"zero-shot, {len(names)} classes, {len(templates)} template(s), {args.split} split of {args.data}, checkpoint {chosen}"
    )
    return report(metrics, args.json)


EVAL = Command("eval", "evaluate a checkpoint with the VSE++ retrieval protocol", add_arguments, run)
