"""``raydist convert vsepp-precomp``: VSE++'s precomputed layout ({split}_ims.npy + {split}_caps.txt)."""

from __future__ import annotations

import argparse
from pathlib import Path

from raydist.converters import Converter, add_min_count, add_splits, register_converter, split_pairs


@register_converter("vsepp-precomp")
class VseppPrecomp(Converter):
    """VSE++ precomputed features: {split}_ims.npy and {split}_caps.txt → a feature pairs dataset."""

    requires = ("src",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--src", help="folder with {split}_ims.npy and {split}_caps.txt")
        parser.add_argument("--captions-per-image", type=int, default=5)
        add_min_count(parser)
        add_splits(parser, "e.g. train=train,val=dev,test=testall (the files' prefixes)")

    def run(self, args: argparse.Namespace) -> Path:
        from raydist.data import convert_vsepp_precomp

        pairs = split_pairs(args.splits)
        return convert_vsepp_precomp(
            args.src,
            args.out,
            captions_per_image=args.captions_per_image,
            min_count=args.min_count,
            splits=dict(pairs) if pairs else None,
            overwrite=args.overwrite,
        )
