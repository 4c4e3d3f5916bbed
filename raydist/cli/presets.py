"""``raydist presets`` and ``raydist ray-ports``: what ships and how to start beside another Ray."""

from __future__ import annotations

import argparse
from pathlib import Path

from raydist.cli.common import Command
from raydist.console import say


def add_presets_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist presets``."""
    p.add_argument("--data", help="a dataset to resolve each schedule on (default: the embedded one)")


def run_presets(args: argparse.Namespace) -> int:
    """Print the table of the shipped presets."""
    from raydist.data import ensure_default_dataset
    from raydist.presets.table import preset_table

    say(preset_table(Path(args.data) if args.data else ensure_default_dataset()))
    return 0


def add_ray_ports_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist ray-ports``."""
    p.add_argument(
        "--dashboard-port", type=int, help="the dashboard and job server port (default: a free one)"
    )


def run_ray_ports(args: argparse.Namespace) -> int:
    """Print the ``ray start`` flags."""
    from raydist.runtime import ray_start_flags

    say(" ".join(ray_start_flags(args.dashboard_port)))
    return 0


PRESETS = Command(
    "presets",
    "the shipped presets: what each is for, its steps and its measured time",
    add_presets_arguments,
    run_presets,
)
RAY_PORTS = Command(
    "ray-ports",
    "`ray start` flags with a free port for every listener of a Ray node and its own temp dir, for a "
    "head beside another Ray on this machine: ray start --head $(raydist ray-ports)",
    add_ray_ports_arguments,
    run_ray_ports,
)
