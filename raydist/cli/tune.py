"""``raydist tune``: a Ray Tune sweep (:mod:`raydist.tune`), or its resume."""

from __future__ import annotations

import argparse
import dataclasses

from raydist.cli.common import Command, add_address, add_storage_shared, preset_plugins, with_plugins
from raydist.config import ConfigError, chosen_preset, preset_names, run_overrides
from raydist.console import say


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist tune``."""
    p.add_argument("--data", help="dataset folder (default: the embedded synthetic dataset, cached)")
    p.add_argument("--preset", help=f"trials' base preset: {', '.join(preset_names())} (default: default)")
    p.add_argument("--preset-file", help="a preset YAML file as the base of every trial")
    p.add_argument("--storage", help="experiment folder's parent: ./runs, or s3:// gs:// NFS on clusters")
    add_storage_shared(p)
    p.add_argument("--num-samples", type=int, help="override the space file's num_samples")
    p.add_argument("--resume", metavar="EXPERIMENT_FOLDER", help="continue an interrupted sweep")
    p.add_argument("--resume-errored", action="store_true", help="with --resume: also re-run failed trials")
    add_address(p)
    p.add_argument("space", nargs="?", help="space file, or a shipped space by name, e.g. margin")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides every trial shares")


def run(args: argparse.Namespace) -> int:
    """Run (or resume) the sweep and print its results, best config and best checkpoint."""
    from raydist.tune import load_space, resolve_base_config

    started = args.space or args.overrides or args.preset or args.preset_file or args.data or args.num_samples
    if args.resume and started:
        raise ConfigError("--resume continues a sweep as it was started: drop the other arguments")
    if not args.resume and not args.space:
        raise ConfigError(
            "give a space file or a shipped space's name (e.g. margin) or --resume EXPERIMENT_FOLDER"
        )
    from raydist.tune.sweep import format_results, resume_sweep, run_sweep

    if args.resume:
        outcome = resume_sweep(args.resume, resume_errored=args.resume_errored, address=args.address)
    else:
        space = load_space(args.space)
        if args.num_samples:
            space = dataclasses.replace(space, num_samples=args.num_samples)
        overrides = run_overrides(args.overrides, data=args.data, storage_shared=args.storage_shared)
        preset = chosen_preset(args.preset, args.preset_file)
        overrides = with_plugins(overrides, args, preset_plugins(preset, args.preset_file))
        cfg = resolve_base_config(space, preset=preset, preset_file=args.preset_file, overrides=overrides)
        outcome = run_sweep(space, cfg, storage_path=args.storage, address=args.address)
    say("\n== sweep results ==")
    say(format_results(outcome))
    say(f"\nexperiment folder: {outcome.experiment_path}")
    say(f"best config:       {outcome.best_config_path}  (raydist train --preset-file FILE)")
    say(f"best checkpoint:   {outcome.best_checkpoint}")
    say(f"resume with:       raydist tune --resume {outcome.experiment_path}")
    return 0 if outcome.best_config_path else 1


TUNE = Command(
    "tune", "Ray Tune sweep: one training run per trial, results table, best config", add_arguments, run
)
