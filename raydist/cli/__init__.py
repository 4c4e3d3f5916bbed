"""``raydist`` command line: parses arguments and calls library functions (no logic lives here).

One module per command (or small group) declares each :class:`~raydist.cli.common.Command`: its name, help
line, options and the function it runs; :data:`COMMANDS` lists them in the order ``raydist --help`` shows.
A new command is a module here and one line in :data:`COMMANDS`."""

from __future__ import annotations

from raydist.cli.clock import STARTED  # first: the CLI's start, for "first optimizer step after …"

# isort: split

import argparse
import sys

from raydist.cli import (
    bench,
    checkpoint,
    convert,
    data,
    embed,
    evaluate,
    experiment,
    plot,
    plugins,
    presets,
    retrieval,
    serve,
    tokenizer,
    train,
    tune,
)
from raydist.cli.common import (
    Command,
    DefaultsHelpFormatter,
    config_from_args,
    plugin_parent,
    plugin_specs,
    preset_from_args,
    resume_config_from_args,
)
from raydist.config import ConfigError
from raydist.console import configure_console, say

COMMANDS: tuple[Command, ...] = (
    train.TRAIN,
    evaluate.EVAL,
    plot.PLOT,
    bench.BENCH,
    experiment.EXPERIMENT,
    retrieval.INDEX,
    retrieval.SEARCH,
    serve.SERVE,
    retrieval.RETRIEVE,
    data.MAKE_DATA,
    data.DATA,
    convert.CONVERT,
    data.CORRUPT_LABELS,
    embed.EMBED,
    presets.PRESETS,
    presets.RAY_PORTS,
    data.VALIDATE,
    tokenizer.TOKENIZER,
    tune.TUNE,
    plugins.PLUGINS,
    checkpoint.CHECKPOINT,
)

__all__ = [
    "COMMANDS",
    "STARTED",
    "Command",
    "DefaultsHelpFormatter",
    "build_parser",
    "config_from_args",
    "main",
    "parse_args",
    "preset_from_args",
    "resume_config_from_args",
]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("raydist")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The ``raydist`` argument parser with every command of :data:`COMMANDS` (each also takes ``--plugin``)."""
    parser = argparse.ArgumentParser(
        prog="raydist",
        description="Ray-native distributed training of retrieval embeddings (image–caption pairs and "
        "class-labelled vectors): data, training, evaluation, retrieval and sweeps.",
    )
    parser.add_argument("--version", action="version", version=f"raydist {_version()}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also show Ray's own logs and worker output (always in the run's raydist.log)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    parent = plugin_parent()
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, parents=[parent])
        command.add_arguments(p)
        p.set_defaults(func=command.run)
    for p in sub.choices.values():  # every option's help shows its default
        p.formatter_class = DefaultsHelpFormatter
    parser.set_defaults(commands=sub.choices)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse a command line; options and ``key=value`` words may come in any order after the command (and after
    a converter's name: ``raydist convert NAME ...``)."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    verbose = any(a in ("-v", "--verbose") for a in argv)
    argv = [a for a in argv if a not in ("-v", "--verbose")]
    commands = parser.get_default("commands")
    if argv and argv[0] in commands:
        command, rest = commands[argv[0]], argv[1:]
        nested = command.get_default("commands")  # a command with sub-commands of its own (convert)
        if nested is None:
            args = command.parse_intermixed_args(rest)
        else:
            at = next((i for i, word in enumerate(rest) if word in nested), None)
            if at is None:  # usage, --help (the list of them), or the error naming the unknown one
                args = command.parse_args(rest)
            else:
                args = nested[rest[at]].parse_intermixed_args(rest[:at] + rest[at + 1 :])
    else:
        args = parser.parse_args(argv)  # usage, --help, --version, or the error for an unknown command
    args.verbose = verbose
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``raydist`` console script. The ``--plugin`` plugins (and installed ``raydist.plugins``
    entry points) are imported first, before the command line is parsed (a plugin's converter or benchmark is
    then a name it knows) and before Ray starts; one that fails is one error line and exit code 2."""
    from raydist.plugins import PluginError, load_plugins

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        load_plugins(plugin_specs(argv))
    except PluginError as e:
        say(f"raydist: error: {e}", stderr=True)
        return 2
    args = parse_args(argv)
    configure_console(getattr(args, "verbose", False))
    try:
        load_plugins(args.plugin or ())  # the same ones, unless an option was abbreviated (--plug)
        return args.func(args)
    except (ConfigError, FileNotFoundError, ValueError) as e:  # bad input: config, data, paths, plugins
        say(f"raydist: error: {e}", stderr=True)
        return 2
    except RuntimeError as e:  # a run that started and failed
        say(f"raydist: error: {e}", stderr=True)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C (raydist.train.stopping), or one outside training
        say("raydist: interrupted", stderr=True)
        return 130
