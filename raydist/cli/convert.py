"""``raydist convert NAME``: a public layout into a raydist dataset, by the converters registered in
:mod:`raydist.converters` (each declares its own options: ``raydist convert NAME --help``)."""

from __future__ import annotations

import argparse
import time

from raydist.cli.common import Command, DefaultsHelpFormatter, plugin_parent, wrote


def add_arguments(p: argparse.ArgumentParser) -> None:
    """One sub-parser per registered converter (the shipped ones and a loaded plugin's): ``--out``, the
    converter's own options, ``--overwrite``."""
    from raydist.converters import CONVERTERS

    p.description = (
        "Convert a public layout into a raydist dataset; `raydist convert NAME --help`: its options."
    )
    sub = p.add_subparsers(dest="format", metavar="CONVERTER", required=True, title="converters")
    parent = plugin_parent()
    for entry in CONVERTERS.entries():
        summary = entry.obj.summary()
        c = sub.add_parser(
            entry.name,
            help=summary,
            description=summary,
            parents=[parent],
            formatter_class=DefaultsHelpFormatter,
        )
        c.add_argument("--out", required=True, help="the dataset folder to write")
        entry.obj().add_arguments(c)
        c.add_argument("--overwrite", action="store_true", help="replace an existing dataset folder")
        c.set_defaults(func=run, format=entry.name)
    p.set_defaults(commands=sub.choices)


def run(args: argparse.Namespace) -> int:
    """Check the converter's required options, convert, and say what was written."""
    from raydist.converters import get_converter

    converter = get_converter(args.format)
    converter.check(args, args.format)
    started = time.perf_counter()
    out = converter.run(args)
    wrote(out, started)
    return 0


CONVERT = Command("convert", "convert a public layout into a raydist dataset", add_arguments, run)
