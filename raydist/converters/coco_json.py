"""``raydist convert coco-json``: COCO-style captions JSON with its images, or with a feature matrix."""

from __future__ import annotations

import argparse
from pathlib import Path

from raydist.converters import Converter, add_min_count, add_splits, register_converter, split_pairs


@register_converter("coco-json")
class CocoJson(Converter):
    """COCO / Karpathy-style captions JSON with an image folder (encoded pairs) or a feature matrix."""

    requires = ("captions",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--captions", help="captions JSON file")
        parser.add_argument(
            "--images", help="image folder (DIR/file_name), instead of --features/--feature-ids"
        )
        parser.add_argument("--features", help=".npy feature matrix, one row per image")
        parser.add_argument("--feature-ids", help=".npy/.json image id of each feature row")
        add_min_count(parser)
        parser.add_argument("--val-images", type=int, default=5000)
        parser.add_argument("--test-images", type=int, default=5000)
        add_splits(
            parser, "values of the images' 'split' field; a split may repeat: train=train,train=restval"
        )

    def run(self, args: argparse.Namespace) -> Path:
        from raydist.data import convert_coco_json
        from raydist.data.convert_images import convert_coco_images

        if bool(args.images) == bool(args.features or args.feature_ids):
            raise ValueError("convert coco-json: give either --images DIR or --features and --feature-ids")
        pairs = split_pairs(args.splits)
        common = {
            "min_count": args.min_count,
            "val_images": args.val_images,
            "test_images": args.test_images,
            "split_map": {src: dst for dst, src in pairs} if pairs else None,
            "overwrite": args.overwrite,
        }
        if args.images:
            return convert_coco_images(args.captions, args.images, args.out, **common)
        return convert_coco_json(args.captions, args.features, args.feature_ids, args.out, **common)
