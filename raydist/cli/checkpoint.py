"""``raydist checkpoint convert``: an older checkpoint's pickle ``state.pt`` rewritten as data (safetensors + JSON)."""

from __future__ import annotations

import argparse

from raydist.cli.common import Command
from raydist.console import say


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist checkpoint``."""
    p.add_argument("action", choices=["convert"])
    p.add_argument("old", help="a checkpoint folder with a state.pt, or a run folder of such checkpoints")
    p.add_argument("new", help="the folder to write (must not exist): the same files, state.pt rewritten")


def run(args: argparse.Namespace) -> int:
    """Convert ``old`` into ``new``; ``old`` is unchanged."""
    from raydist.checkpoint import convert_checkpoints

    converted = convert_checkpoints(args.old, args.new)
    for folder in converted:
        say(f"converted: {folder}")
    say(f"{len(converted)} checkpoint(s) written as state.safetensors + state.json under {args.new}")
    return 0


CHECKPOINT = Command(
    "checkpoint",
    "convert a checkpoint written before raydist stored state as data (a pickle state.pt) into safetensors + "
    "JSON. Only for files you trust: converting unpickles state.pt (weights_only=False), which runs any code "
    "in it; every other command refuses such a file",
    add_arguments,
    run,
)
