"""What the command modules share: the :class:`Command` a module declares, the help formatter, the ``--plugin``
option every command takes, the run-config options and the config a command line describes."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from raydist.config import Config, ConfigError, preset_names, read_preset_file, run_overrides
from raydist.console import say


@dataclass(frozen=True)
class Command:
    """One ``raydist`` sub-command: its name, the one line ``raydist --help`` lists, the function that adds its
    options to its parser and the function that runs it (returns the exit code)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Append ``(default: X)`` to an option's help when it has a real default that the help text does not
    already describe (no "(default: None)" or "(default: False)" noise)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "default" in text
            or action.default in (None, False, argparse.SUPPRESS)
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


def plugin_parent() -> argparse.ArgumentParser:
    """The parent parser of every sub-command: ``--plugin PATH_OR_MODULE`` (repeatable)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--plugin",
        action="append",
        metavar="PATH_OR_MODULE",
        help="import this plugin first (a .py file, a package folder or a module name) -- it may register "
        "encoders, losses, tasks, converters, hooks, benchmarks; repeatable; a run's config keeps it (plugins)",
    )
    return parent


def plugin_specs(argv: Sequence[str]) -> list[str]:
    """The ``--plugin`` values of a command line, read before it is parsed (a plugin's converter or benchmark
    must be registered for the full parser to know it); [] when the line cannot be read that way."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    pre.add_argument("--plugin", action="append", default=[])
    try:
        known, _ = pre.parse_known_args(list(argv))
    except argparse.ArgumentError:  # e.g. --plugin without a value: the real parser says so
        return []
    return list(known.plugin)


def _plugin_list(value: Any) -> list[str] | None:
    """A ``plugins`` value of a preset or a ``plugins=`` override as a list of names (``a.py`` → ``[a.py]``,
    ``[a.py, b]`` → both); None when it is not one (the config's own check says why)."""
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value) if value.strip() else []
        except yaml.YAMLError:
            return None
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def preset_plugins(preset: str | None, preset_file: str | Path | None) -> list[str]:
    """The ``plugins`` the shipped preset and the preset file name (a file that names them replaces the
    preset's, as its other keys do; its ``tasks:`` blocks' are added to its own)."""
    files: list[Any] = []
    if preset in preset_names():
        files.append(resources.files("raydist.presets") / f"{preset}.yaml")
    if preset_file:
        files.append(preset_file)
    plugins: list[str] = []
    for file in files:
        common, blocks = read_preset_file(file)
        parts = [part for part in (common, *blocks.values()) if "plugins" in part]
        if parts:
            plugins = [p for part in parts for p in _plugin_list(part["plugins"]) or []]
    return plugins


def with_plugins(
    overrides: dict[str, Any], args: argparse.Namespace, inherited: Sequence[str] = ()
) -> dict[str, Any]:
    """``overrides`` with ``plugins`` set to the config's own plugins (the ``plugins=`` override, else
    ``inherited``: the preset's or the checkpoint's) followed by this command line's ``--plugin`` ones, each
    resolved (:func:`raydist.plugins.resolve_spec`), without duplicates -- so the run's saved config carries
    them. Unchanged when ``--plugin`` adds nothing."""
    from raydist.plugins import resolve_spec

    added = [resolve_spec(spec) for spec in getattr(args, "plugin", None) or ()]
    own = _plugin_list(overrides["plugins"]) if "plugins" in overrides else list(inherited)
    if not added or own is None:
        return overrides
    return {**overrides, "plugins": list(dict.fromkeys([*(resolve_spec(p) for p in own), *added]))}


def add_config_args(p: argparse.ArgumentParser) -> None:
    """The options of a command that builds a run config: data, presets, storage, run name, cluster, overrides."""
    p.add_argument("--data", help="dataset folder (default: the embedded synthetic dataset, cached)")
    p.add_argument(
        "--preset",
        help=f"shipped preset: {', '.join(preset_names())} (default: with --data, the one "
        "the dataset's size and captions pick, said in one line; else default)",
    )
    p.add_argument("--preset-file", help="a preset YAML file (e.g. the best config a Tune sweep wrote)")
    p.add_argument("--storage", help="train.storage_path: local folder, or s3:// gs:// NFS on clusters")
    add_storage_shared(p)
    p.add_argument(
        "--name",
        help="train.run_name: an existing run of this name continues if it is unfinished "
        "and has the same config",
    )
    add_address(p)
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="dotted config overrides, e.g. loss.margin=0.1"
    )


def add_storage_shared(p: argparse.ArgumentParser) -> None:
    """``--storage-shared`` (train.storage_shared)."""
    p.add_argument(
        "--storage-shared",
        action="store_true",
        help="train.storage_shared: the local --storage folder is mounted on every node (NFS), so a "
        "multi-node cluster may use it",
    )


def add_address(p: argparse.ArgumentParser) -> None:
    """``--address``: the Ray cluster to join."""
    p.add_argument("--address", help="join this Ray cluster (default: RAY_ADDRESS, else a private local Ray)")


def add_latest(p: argparse.ArgumentParser) -> None:
    """``--latest``: a run folder means its newest checkpoint."""
    p.add_argument(
        "--latest", action="store_true", help="a run folder means its newest checkpoint, not its best"
    )


def _say(line: str, args: argparse.Namespace) -> None:
    """A line saying what was chosen: on stdout, or on stderr under ``--print-config``."""
    say(line, stderr=getattr(args, "print_config", False))


def preset_from_args(args: argparse.Namespace) -> str | None:
    """``--preset``; none for ``--preset-file`` alone; with ``--data`` and neither, the preset the dataset's
    shape picks (one line says which and why: on stderr under ``--print-config``); else the default."""
    from raydist.recipe import data_preset

    name, line = data_preset(args.data, args.preset, args.preset_file)
    if line:
        _say(line, args)
    return name


def config_from_args(args: argparse.Namespace) -> Config:
    """The run Config an argparse namespace describes (:func:`raydist.recipe.run_recipe`: preset, preset file,
    the image rules that follow from --data, overrides, and ``--plugin`` added to the config's ``plugins``); the
    lines saying what was chosen are printed (on stderr under ``--print-config``)."""
    from raydist.recipe import run_recipe

    overrides = run_overrides(
        args.overrides,
        data=args.data,
        storage=args.storage,
        name=args.name,
        storage_shared=args.storage_shared,
    )
    overrides = with_plugins(overrides, args, preset_plugins(args.preset, args.preset_file))
    recipe = run_recipe(args.data, preset=args.preset, preset_file=args.preset_file, overrides=overrides)
    for line in recipe.lines:
        _say(line, args)
    return recipe.config


def saved_plugins(checkpoint: str | Path) -> list[str]:
    """The ``plugins`` a checkpoint's (or a run folder's newest checkpoint's) saved config names."""
    from raydist.checkpoint.io import find_checkpoint
    from raydist.checkpoint.names import CONFIG_FILE

    common, _ = read_preset_file(find_checkpoint(checkpoint) / CONFIG_FILE)
    return _plugin_list(common.get("plugins")) or []


def resume_config_from_args(args: argparse.Namespace) -> Config:
    """``--resume``: the checkpoint's own config with this command line's overrides (architecture keys
    refused; ``--plugin`` added to its ``plugins``); prints what changed."""
    from raydist.checkpoint import format_changes, resumed_config

    if args.preset or args.preset_file:
        raise ConfigError("--resume continues with the checkpoint's config: drop --preset/--preset-file")
    overrides = run_overrides(args.overrides, data=args.data, storage_shared=args.storage_shared)
    if getattr(args, "plugin", None):
        overrides = with_plugins(overrides, args, saved_plugins(args.resume))
    cfg, changes = resumed_config(args.resume, overrides)
    say(f"resuming with the checkpoint's config; {format_changes(changes)}")
    return cfg


def dims(text: str | None) -> list[int] | None:
    """``8,16,32`` → [8, 16, 32]."""
    if not text:
        return None
    try:
        return [int(d) for d in text.split(",")]
    except ValueError as e:
        raise ValueError(f"--dims: expected comma-separated integers, got {text!r}") from e


def wrote(out: str | Path, started: float) -> None:
    """``wrote dataset OUT in 2.1 s`` and what it holds (:func:`raydist.data.summary.dataset_summary`)."""
    from raydist.data.summary import dataset_summary

    say(f"wrote dataset {out} in {time.perf_counter() - started:.1f} s")
    say("\n".join(dataset_summary(out)))
