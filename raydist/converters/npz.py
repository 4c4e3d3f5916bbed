"""``raydist convert npz``: an ``.npz`` of class-labelled feature vectors."""

from __future__ import annotations

import argparse
from pathlib import Path

from raydist.converters import Converter, add_seeded_split, register_converter, seeded_split


@register_converter("npz")
class Npz(Converter):
    """An .npz with X (N×D features), y (labels) and an optional split → a labels dataset."""

    requires = ("src",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--src", help="a .npz file with X (N×D features), y (labels) and optional split")
        add_seeded_split(parser, "without a split array", "each class's rows")
        parser.add_argument(
            "--standardize",
            action="store_true",
            help="scale each feature to (x - mean) / std with the train split's mean and std (saved "
            "in the dataset as standardization.json, for new query vectors)",
        )

    def run(self, args: argparse.Namespace) -> Path:
        from raydist.data.labels_io import convert_npz

        return convert_npz(
            args.src,
            args.out,
            overwrite=args.overwrite,
            standardize=args.standardize,
            **seeded_split(args),
        )
