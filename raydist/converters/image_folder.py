"""``raydist convert image-folder``: a torchvision ImageFolder tree of class folders."""

from __future__ import annotations

import argparse
from pathlib import Path

from raydist.converters import Converter, add_seeded_split, register_converter, seeded_split


@register_converter("image-folder")
class ImageFolder(Converter):
    """An ImageFolder tree, DIR/<class>/<images> (or DIR/train, DIR/val, DIR/test) → an encoded labels dataset."""

    requires = ("src",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--src", help="DIR/<class>/<images> (or DIR/train, DIR/val, DIR/test)")
        parser.add_argument(
            "--split-by",
            choices=["class", "image"],
            default="image",
            help="without split folders: disjoint classes per split, or stratified by class",
        )
        add_seeded_split(
            parser, "without split folders", "each class's images (--split-by image) or of the classes"
        )

    def run(self, args: argparse.Namespace) -> Path:
        from raydist.data.convert_images import convert_image_folder

        return convert_image_folder(
            args.src,
            args.out,
            split_by=args.split_by,
            overwrite=args.overwrite,
            **seeded_split(args),
        )
