"""The dataset commands: ``raydist make-data`` (synthetic sets, the embedded one), ``raydist data`` (where the
embedded set is, what a dataset holds), ``raydist corrupt-labels`` and ``raydist validate``."""

from __future__ import annotations

import argparse
import time

from raydist.cli.common import Command, wrote
from raydist.console import say


def _add_overwrite(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset folder")


def add_make_data_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist make-data``."""
    p.add_argument("kind", nargs="?", choices=["synthetic", "synthetic-labels"])
    p.add_argument("--out", help="the dataset folder to write (with a kind)")
    p.add_argument("--images", type=int, default=3000, help="synthetic: train images")
    p.add_argument(
        "--val-images", type=int, default=None, help="synthetic: val images (default: images // 6)"
    )
    p.add_argument(
        "--test-images", type=int, default=None, help="synthetic: test images (default: images // 3)"
    )
    p.add_argument("--captions-per-image", type=int, default=5)
    p.add_argument("--dim", type=int, default=None, help="feature dimension (default 128; labels: 32)")
    p.add_argument("--classes", type=int, default=10, help="synthetic-labels: classes K")
    p.add_argument("--train-per-class", type=int, default=100, help="synthetic-labels: train rows per class")
    p.add_argument("--val-per-class", type=int, default=20, help="synthetic-labels: val rows per class")
    p.add_argument("--test-per-class", type=int, default=40, help="synthetic-labels: test rows per class")
    p.add_argument(
        "--overlap",
        type=float,
        default=0.5,
        help="synthetic-labels: class overlap in [0, 1] (shared probability mass of two classes)",
    )
    p.add_argument("--duplicates", type=int, default=1, help="synthetic-labels: copies of each train example")
    p.add_argument("--seed", type=int, default=0)
    _add_overwrite(p)


def run_make_data(args: argparse.Namespace) -> int:
    """Write a synthetic dataset, or (no kind) make the embedded one in the cache."""
    from raydist.data import ensure_default_dataset, make_synthetic
    from raydist.data.synthetic_labels import make_synthetic_labels

    started = time.perf_counter()
    if args.kind is None:  # the embedded default dataset (what `raydist train` uses with no --data)
        if args.out:
            raise ValueError(
                "make-data: --out goes with a kind (synthetic, synthetic-labels); without one the "
                "embedded dataset is made in the cache (`raydist data path` prints where)"
            )
        from raydist.data.summary import dataset_summary

        folder = ensure_default_dataset()
        say(f"embedded dataset: {folder} (the default of `raydist train`, cached)")
        say("\n".join(dataset_summary(folder)))
        return 0
    if not args.out:
        raise ValueError(f"make-data {args.kind}: give --out DIR")
    if args.kind == "synthetic-labels":
        out = make_synthetic_labels(
            args.out,
            classes=args.classes,
            train_per_class=args.train_per_class,
            val_per_class=args.val_per_class,
            test_per_class=args.test_per_class,
            dim=args.dim or 32,
            overlap=args.overlap,
            duplicates=args.duplicates,
            seed=args.seed,
            overwrite=args.overwrite,
        )
        wrote(out, started)
        return 0
    out = make_synthetic(
        args.out,
        images=args.images,
        captions_per_image=args.captions_per_image,
        dim=args.dim or 128,
        seed=args.seed,
        val_images=args.val_images,
        test_images=args.test_images,
        overwrite=args.overwrite,
    )
    wrote(out, started)
    return 0


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist data``."""
    p.add_argument("action", choices=["path", "summary"])
    p.add_argument("dir", nargs="?", help="summary: a dataset folder (default: the embedded one)")


def run_data(args: argparse.Namespace) -> int:
    """Print the embedded dataset's folder, or a dataset's summary."""
    from raydist.data import ensure_default_dataset
    from raydist.data.summary import dataset_summary

    if args.action == "path":
        say(ensure_default_dataset())
        return 0
    folder = args.dir or ensure_default_dataset()
    say(folder)
    say("\n".join(dataset_summary(folder)))
    return 0


def add_corrupt_labels_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist corrupt-labels``."""
    p.add_argument("--src", required=True, help="labelled dataset folder")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--p", type=float, required=True, help="flip probability in [0, 1): uniform to another class"
    )
    p.add_argument("--seed", type=int, default=0)
    _add_overwrite(p)


def run_corrupt_labels(args: argparse.Namespace) -> int:
    """Copy a labelled dataset with its train labels flipped."""
    from raydist.data.labels_io import corrupt_labels

    started = time.perf_counter()
    out = corrupt_labels(args.src, args.out, p=args.p, seed=args.seed, overwrite=args.overwrite)
    say(f"train labels flipped with p={args.p}, seed {args.seed}; clean labels kept")
    wrote(out, started)
    return 0


def add_validate_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist validate``."""
    p.add_argument("dir")
    p.add_argument(
        "--image-sample",
        type=int,
        metavar="N",
        help="encoded images: decode N per split, drawn with a fixed seed (default: every image)",
    )


def run_validate(args: argparse.Namespace) -> int:
    """Run every data check and print the report; exit 1 on problems."""
    from raydist.data import validate_dataset
    from raydist.data.remote import local_dataset
    from raydist.tasks import task_names

    # a URI: its local copy; a WebDataset folder: its index (whose build refuses bad samples by shard and key)
    folder = local_dataset(args.dir)
    report = validate_dataset(folder, tasks=task_names(), image_sample=args.image_sample)
    say(report.format())
    return 1 if report.problems else 0


MAKE_DATA = Command(
    "make-data",
    "write a synthetic dataset: image–caption pairs or labelled vectors (no kind: the embedded "
    "dataset `raydist train` uses, in the cache)",
    add_make_data_arguments,
    run_make_data,
)
DATA = Command(
    "data",
    "`data path`: where the embedded dataset is; `data summary [DIR]`: what a dataset holds",
    add_data_arguments,
    run_data,
)
CORRUPT_LABELS = Command(
    "corrupt-labels",
    "copy a labelled dataset with train labels flipped at rate p",
    add_corrupt_labels_arguments,
    run_corrupt_labels,
)
VALIDATE = Command(
    "validate",
    "run every data check without training and print a summary",
    add_validate_arguments,
    run_validate,
)
