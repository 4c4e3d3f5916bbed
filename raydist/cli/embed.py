"""``raydist embed``: an image encoder's outputs over an encoded-image dataset, written as a feature dataset."""

from __future__ import annotations

import argparse

from raydist.cli.common import Command, add_latest
from raydist.console import say


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist embed``."""
    p.add_argument("--data", required=True, help="a dataset of encoded images (pairs or labels)")
    p.add_argument("--out", required=True, help="the feature dataset to write")
    p.add_argument(
        "--checkpoint", help="checkpoint folder or run folder (its best checkpoint) of a run on images"
    )
    add_latest(p)
    p.add_argument(
        "--image-encoder",
        help="instead of a checkpoint: an image encoder name (small-cnn, "
        "torchvision:resnet50, timm:…), its backbone's outputs",
    )
    p.add_argument(
        "--image-weights", help="with --image-encoder: the backbone's weights (a local state-dict file)"
    )
    p.add_argument(
        "--image-size",
        type=int,
        help="with --image-encoder: the crop side (default: the median image's shorter side, at most 224)",
    )
    p.add_argument(
        "--output",
        choices=["backbone", "head"],
        default="backbone",
        help="backbone: the features before the projection head (default; the VSE++ precomp route); "
        "head: the trained projection's output, before normalisation (with --checkpoint)",
    )
    p.add_argument("--batch-size", type=int, default=128, help="images per forward pass")
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset at --out")


def run(args: argparse.Namespace) -> int:
    """Embed every image of the dataset with the chosen encoder and write the feature dataset."""
    from raydist.data import load_manifest
    from raydist.extract import checkpoint_encoder, extract_features, pretrained_encoder

    if (args.checkpoint is None) == (args.image_encoder is None):
        raise ValueError(
            "give one of --checkpoint RUN (a trained image encoder) or --image-encoder NAME "
            "(a pretrained, not fine-tuned one)"
        )
    if args.checkpoint is not None:
        if args.image_weights or args.image_size:
            raise ValueError("--image-weights/--image-size go with --image-encoder; a checkpoint has its own")
        encoder = checkpoint_encoder(args.checkpoint, args.data, output=args.output, latest=args.latest)
        say(
            f"[raydist] embed: the image encoder of checkpoint {encoder.source['checkpoint']} ({args.output})"
        )
    else:
        if args.output != "backbone":
            raise ValueError(
                "--output head needs --checkpoint: a pretrained encoder's projection head is untrained"
            )
        encoder = pretrained_encoder(
            args.image_encoder,
            load_manifest(args.data),
            weights=args.image_weights,
            image_size=args.image_size,
        )
        say(
            f"[raydist] embed: {args.image_encoder} backbone, weights "
            f"{args.image_weights or 'as initialised (no --image-weights)'}"
        )
    manifest = extract_features(
        args.data, args.out, encoder, batch_size=args.batch_size, overwrite=args.overwrite
    )
    rows = ", ".join(f"{s} {info.rows}" for s, info in manifest.splits.items())
    say(f"wrote {args.out}: task {manifest.task}, {manifest.feature_dim}-d features, rows {rows}")
    say(f"train on it with:  raydist train --data {args.out}")
    return 0


EMBED = Command(
    "embed",
    "an image encoder's outputs over an encoded-image dataset, written as a "
    "precomputed-feature dataset (a trained checkpoint's, or a pretrained one's)",
    add_arguments,
    run,
)
