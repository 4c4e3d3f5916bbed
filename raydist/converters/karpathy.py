"""``raydist convert karpathy``: Karpathy's split JSON (Flickr8k, Flickr30k, COCO) and its image files."""

from __future__ import annotations

import argparse
from pathlib import Path

from raydist.converters import Converter, add_min_count, register_converter


@register_converter("karpathy")
class Karpathy(Converter):
    """Karpathy's dataset_*.json (Flickr8k, Flickr30k, COCO) and its images → an encoded pairs dataset."""

    requires = ("src", "images")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--src", help="dataset_*.json")
        parser.add_argument("--images", help="image root (ROOT/filepath/filename)")
        add_min_count(parser)

    def run(self, args: argparse.Namespace) -> Path:
        from raydist.data.convert_images import convert_karpathy

        return convert_karpathy(
            args.src, args.images, args.out, min_count=args.min_count, overwrite=args.overwrite
        )
