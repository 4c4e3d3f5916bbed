"""``raydist tokenizer``: train a subword tokenizer on a dataset's train captions, or set a given one."""

from __future__ import annotations

import argparse
from pathlib import Path

from raydist.cli.common import Command
from raydist.console import say


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist tokenizer``."""
    p.add_argument("action", choices=["train", "set"])
    p.add_argument("--data", required=True, help="the dataset folder (task pairs)")
    p.add_argument("--vocab-size", type=int, help="train: at most this many tokens")
    p.add_argument(
        "--kind", choices=["wordpiece", "bpe"], default="wordpiece", help="train: the subword model"
    )
    p.add_argument("--tokenizer", help="set: a tokenizer.json file (e.g. a pretrained model folder's)")
    p.add_argument(
        "--out",
        default="tokenizer.json",
        help="train: the file to write (default ./tokenizer.json; the "
        "dataset is not changed until `raydist tokenizer set`)",
    )
    p.add_argument("--overwrite", action="store_true", help="train: replace an existing --out file")


def run(args: argparse.Namespace) -> int:
    """``train``: learn a tokenizer into ``--out``; ``set``: make ``--tokenizer`` the dataset's."""
    from raydist.data.tokenizer import set_dataset_tokenizer, train_captions, train_tokenizer

    if args.action == "train":
        if not args.vocab_size:
            raise ValueError("tokenizer train: give --vocab-size N")
        out = Path(args.out)
        if out.exists() and not args.overwrite:
            raise ValueError(f"tokenizer train: {out} exists; give another --out or --overwrite")
        tokenizer = train_tokenizer(train_captions(args.data), args.vocab_size, args.kind)
        tokenizer.save(out)
        say(
            f"trained a {args.kind} tokenizer on the train captions of {args.data}: {len(tokenizer)} tokens, "
            f"saved as {out}; to train with it: raydist tokenizer set --data {args.data} --tokenizer {out}"
        )
        return 0
    if not args.tokenizer:
        raise ValueError("tokenizer set: give --tokenizer FILE (a tokenizer.json)")
    tokenizer = set_dataset_tokenizer(args.data, args.tokenizer)
    say(f"copied {args.tokenizer}: {len(tokenizer)} tokens, saved as {Path(args.data) / 'tokenizer.json'}")
    return 0


TOKENIZER = Command(
    "tokenizer",
    "train a subword tokenizer on a dataset's train captions, or set a given "
    "tokenizer.json, as the dataset's tokenizer (model.text_encoder=transformer|hf:PATH use it)",
    add_arguments,
    run,
)
