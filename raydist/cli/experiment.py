"""``raydist experiment``: a paper's claim as an experiment (:mod:`raydist.experiments`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from raydist.cli.common import Command, add_address, with_plugins
from raydist.config import parse_overrides
from raydist.console import say


class _ExperimentNames:
    """The registered experiments' names, read when a help text is printed (building the parser imports no
    experiment)."""

    def __str__(self) -> str:
        from raydist.experiments.catalog import experiment_names

        return ", ".join(experiment_names())


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist experiment``."""
    name = p.add_argument("name", help="the experiment: %(known)s")
    name.known = _ExperimentNames()  # type: ignore[attr-defined]  -- the help's %(known)s
    p.add_argument("--quick", action="store_true", help="tiny preset, one seed, 1-2 epochs (a smoke run)")
    p.add_argument("--seeds", help="comma-separated seeds (default: the experiment's)")
    p.add_argument(
        "--data",
        help="dataset folder, or a named dataset: synthetic-pairs, digit-halves (pairs); "
        "synthetic, digits, duplicated, no-duplicates (labels) (default: the experiment's own data)",
    )
    p.add_argument("--preset", help="base preset of every trial (default: the experiment's)")
    p.add_argument("--out", help="folder for the table, figures and records")
    p.add_argument("--storage", help="experiment folders' parent: ./runs, or s3:// gs:// NFS on clusters")
    add_address(p)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides every trial shares")


def run(args: argparse.Namespace) -> int:
    """Run the experiment and print where its outputs went."""
    from raydist.experiments import run_experiment

    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    result = run_experiment(
        args.name,
        quick=args.quick,
        seeds=seeds,
        data=args.data,
        out_dir=args.out,
        preset=args.preset,
        overrides=with_plugins(parse_overrides(args.overrides), args),
        storage=args.storage,
        address=args.address,
    )
    for key, value in result.items():
        if isinstance(value, (str, Path)):
            say(f"{key + ':':18} {value}")
    return 0


EXPERIMENT = Command(
    "experiment", "run a paper's claim as an experiment: sweep, table, PNG, verdict", add_arguments, run
)
