"""``raydist plot``: PNG plots of a run or of a Tune sweep."""

from __future__ import annotations

import argparse

from raydist.cli.common import Command
from raydist.console import say


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist plot``."""
    p.add_argument(
        "run", help="a run folder (with history.json / steps.jsonl) or a sweep's experiment folder"
    )
    p.add_argument("--metric", help="sweeps: the metric to plot (default: the space file's)")
    p.add_argument("--out", help="folder for the PNGs (default: RUN/plots)")


def run(args: argparse.Namespace) -> int:
    """Write the plots; exit 1 when there was nothing to plot."""
    from raydist.plots import plot_folder

    files = plot_folder(args.run, args.metric, out_dir=args.out)
    for path in files:
        say(f"wrote {path}")
    return 0 if files else 1


PLOT = Command(
    "plot",
    "PNG plots of a run (loss with the SH→MH switch, validation, negatives) "
    "or of a Tune sweep (metric against each searched key)",
    add_arguments,
    run,
)
