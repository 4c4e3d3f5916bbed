"""``raydist train``: a training run (Ray Train, or in process), its resume, ``--auto`` and ``--print-config``."""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path

from raydist.cli.clock import STARTED
from raydist.cli.common import Command, add_config_args, config_from_args, resume_config_from_args
from raydist.config import ConfigError, dump_yaml, parse_overrides
from raydist.console import say


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist train``."""
    add_config_args(p)
    p.add_argument("--resume", help="checkpoint folder (or run folder) to resume from")
    p.add_argument("--json", help="also write the outcome (history, checkpoints, test metrics) as JSON")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument(
        "--force",
        action="store_true",
        help="--name of an existing run: delete that run folder and start the run over",
    )
    p.add_argument(
        "--auto",
        action="store_true",
        help="first search lr, crops, flips, the small CNN's width and "
        "grid, MH/SH with short Tune trials (ASHA, the defaults first), then train the winner; keys set "
        "as key=value stay fixed",
    )
    p.add_argument("--budget", type=float, metavar="MIN", help="--auto: minutes of search (default 5)")


def run(args: argparse.Namespace) -> int:
    """Train (or print the config, or search first with ``--auto``) and print the outcome."""
    from raydist.eval.metrics import format_metrics
    from raydist.train.trainer import format_history, format_startup, run_training

    imported = time.time()
    if args.budget is not None and not args.auto:
        raise ConfigError("--budget is the --auto search's minutes: add --auto")
    if args.auto and (args.resume or args.print_config):
        raise ConfigError("--auto searches, then starts a new run: drop --resume/--print-config")
    cfg = resume_config_from_args(args) if args.resume else config_from_args(args)
    if args.print_config:
        say(dump_yaml(cfg))
        return 0
    if args.auto:
        from raydist.tune.auto import DEFAULT_BUDGET_MIN, auto_search

        budget = DEFAULT_BUDGET_MIN if args.budget is None else args.budget
        cfg = auto_search(
            cfg, fixed=parse_overrides(args.overrides), budget_min=budget, address=args.address
        ).config
    outcome = run_training(cfg, resume_from=args.resume, address=args.address, force=args.force)
    if outcome.stopped:
        resume = f"raydist train --resume {shlex.quote(str(outcome.latest_checkpoint))}"
        say(f"\nstopped on request; run folder: {outcome.run_dir}")
        say(f"checkpoint:        {outcome.latest_checkpoint}")
        say(
            f"resume with:       {resume}"
            + (f" --address {shlex.quote(args.address)}" if args.address else "")
        )
        return 130
    if outcome.first_step_unix is not None:
        say(
            f"[raydist] first optimizer step {outcome.first_step_unix - STARTED:.1f} s after `raydist` started "
            "(Python's own start-up not counted)"
        )
        outcome.startup = {
            "launch": STARTED,
            "imports": imported,
            **outcome.startup,
            "first_step": outcome.first_step_unix,
        }
        say(f"[raydist] start-up: {format_startup(outcome.startup, STARTED)} after `raydist` started")
    say("\n== per-epoch metrics ==")
    say(format_history(outcome.history, outcome.columns))
    if outcome.resumed_at:
        say(f"resumed from a checkpoint at step {', '.join(map(str, outcome.resumed_at))}")
    if outcome.test_metrics:
        say("\n== test split, best checkpoint ==")
        say(format_metrics(outcome.test_metrics))
    say(f"\nrun folder:        {outcome.run_dir}")
    say(f"dataset:           {outcome.data_dir}")
    say(f"best checkpoint:   {outcome.best_checkpoint}")
    say(f"latest checkpoint: {outcome.latest_checkpoint}")
    if outcome.best_checkpoint:
        say(f"evaluate with:     raydist eval --checkpoint {outcome.best_checkpoint} --split test")
    if args.json:
        Path(args.json).write_text(json.dumps(vars(outcome), indent=2, default=str))
    return 0


TRAIN = Command(
    "train", "train with Ray Train (default: short run on the embedded dataset)", add_arguments, run
)
