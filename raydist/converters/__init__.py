"""raydist.converters: ``raydist convert NAME`` -- a public layout (Karpathy JSON, COCO captions, an ImageFolder
tree, VSE++ precomp, ``.npz``) turned into a raydist dataset.

A converter is a :class:`Converter` subclass in a module of this package that registers itself with
``@register_converter("name")``: it declares its own command-line options (:meth:`Converter.add_arguments`;
``raydist convert NAME --help`` shows only those, with ``--out`` and ``--overwrite``) and converts
(:meth:`Converter.run`). :data:`CONVERTERS` imports every module of this package the first time it is read
(:meth:`raydist.registry.Registry.discover`), so a new converter is one file here (+ its test); a plugin
(:mod:`raydist.plugins`) registers one the same way. A converter's module holds its conversion too (the source
layout's parsing and checks); :mod:`raydist.converters.source_files` holds what several share. What they write
is :mod:`raydist.data`'s format (``DatasetWriter``), which knows no source layout.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from raydist.registry import Registry


class Converter:
    """A public layout → a raydist dataset. The first line of a subclass's docstring is its one-line summary
    (``raydist convert --help``); ``requires``: its options that must be given (``("src", "images")``), checked
    before :meth:`run` with one error line naming the missing ones."""

    requires: tuple[str, ...] = ()

    @classmethod
    def summary(cls) -> str:
        """The first line of the class docstring."""
        return (cls.__doc__ or cls.__name__).strip().splitlines()[0]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add this converter's options (``--out`` and ``--overwrite`` are every converter's)."""

    def check(self, args: argparse.Namespace, name: str) -> None:
        """Refuse a command line that misses a required option (``convert NAME: give --a and --b``)."""
        missing = [f"--{option.replace('_', '-')}" for option in self.requires if not getattr(args, option)]
        if missing:
            raise ValueError(f"convert {name}: give {' and '.join(missing)}")

    def run(self, args: argparse.Namespace) -> Path:
        """Write the dataset ``args.out`` (replacing one there with ``args.overwrite``); return its folder."""
        raise NotImplementedError


CONVERTERS: Registry[type[Converter]] = Registry("converter", package=__name__)


def register_converter(name: str) -> Callable[[type[Converter]], type[Converter]]:
    """Class decorator: register a :class:`Converter` subclass as ``raydist convert NAME``."""
    return CONVERTERS.register(name)


def get_converter(name: str) -> Converter:
    """The converter registered as ``name`` (a shipped one or a loaded plugin's); unknown: a RegistryError."""
    return CONVERTERS.get(name)()


# options more than one converter takes, with the same meaning


def add_min_count(parser: argparse.ArgumentParser) -> None:
    """``--min-count``: the vocabulary's minimum word count (of the train captions)."""
    parser.add_argument("--min-count", type=int, default=4, help="vocabulary minimum word count (VSE++: 4)")


def add_seeded_split(parser: argparse.ArgumentParser, when: str, of: str) -> None:
    """``--val-fraction``, ``--test-fraction`` and ``--seed`` of a seeded split made ``when`` (e.g. "without a
    split array"), each split's share ``of`` (e.g. "each class's rows")."""
    for split, default in (("val", 0.1), ("test", 0.2)):
        parser.add_argument(
            f"--{split}-fraction", type=float, default=default, help=f"{when}: {split} share of {of}"
        )
    parser.add_argument("--seed", type=int, default=0, help=f"{when}: seed of the split")


def seeded_split(args: argparse.Namespace) -> dict[str, float | int]:
    """The keyword arguments :func:`add_seeded_split`'s options give: ``val_fraction``, ``test_fraction``,
    ``seed``."""
    return {"val_fraction": args.val_fraction, "test_fraction": args.test_fraction, "seed": args.seed}


def add_splits(parser: argparse.ArgumentParser, source: str) -> None:
    """``--splits``: raydist split = a source split's name (``source`` says what the names are)."""
    parser.add_argument("--splits", help=f"raydist split = source name, {source}")


def split_pairs(text: str | None) -> list[tuple[str, str]] | None:
    """``train=train,val=dev,test=testall`` → ``[(raydist split, source name), ...]``."""
    if not text:
        return None
    pairs = [item.partition("=") for item in text.split(",")]
    bad = [a + b + c for a, b, c in pairs if not b or a not in ("train", "val", "test")]
    if bad:
        raise ValueError(f"--splits: expected train=NAME,val=NAME,test=NAME, got {', '.join(bad)}")
    return [(a, c) for a, _, c in pairs]


__all__ = [
    "CONVERTERS",
    "Converter",
    "add_min_count",
    "add_seeded_split",
    "add_splits",
    "get_converter",
    "register_converter",
    "seeded_split",
    "split_pairs",
]
