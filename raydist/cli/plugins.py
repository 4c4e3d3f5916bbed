"""``raydist plugins``: every registered name per kind (tasks, encoders, losses, converters, hooks,
benchmarks, ...) with the module that registered it, after the shipped components and the ``--plugin`` ones."""

from __future__ import annotations

import argparse
import importlib
import importlib.util

from raydist.cli.common import Command
from raydist.console import say

# the shipped modules that register components when imported, or hold a registry that imports its package's
# modules when read (a kind whose module is absent does not show)
PROVIDERS = (
    "raydist.tasks",
    "raydist.models.image_encoders",
    "raydist.models.text_encoders",
    "raydist.losses",
    "raydist.train.wiring",
    "raydist.converters",
    "raydist.benchmarks",
    "raydist.experiments.catalog",
)


def import_shipped() -> None:
    """Import every shipped component, so that each registry holds its shipped names."""
    for module in PROVIDERS:
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)


def registered_lines(kind: str | None = None) -> list[str]:
    """``kind (N)`` then one ``  name  module`` line per registered name, for every kind by name (or ``kind``:
    a kind's name, ``-`` or ``_`` for its spaces); an unknown kind is a RegistryError listing the kinds."""
    from raydist.registry import registries, registry

    chosen = [registry(kind.replace("-", " ").replace("_", " "))] if kind else list(registries().values())
    lines: list[str] = []
    for reg in sorted(chosen, key=lambda r: r.kind):
        shown = list(zip(reg.shown_names(), reg.entries(), strict=False))
        width = max((len(s) for s, _ in shown), default=0)
        lines.append(f"{reg.kind} ({len(shown)})")
        lines.extend(f"  {s:<{width}}  {entry.module}" for s, entry in shown)
    return lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist plugins``."""
    p.add_argument("--kind", help="only this kind, e.g. loss, converter, benchmark, image-encoder")


def run(args: argparse.Namespace) -> int:
    """Print the loaded plugins, then the registered names per kind."""
    from raydist.plugins import load_entry_points, loaded_plugins

    import_shipped()
    entry_points = load_entry_points()
    say(f"plugins loaded: {', '.join(loaded_plugins()) or '(none)'}")
    if entry_points:
        say(f"entry points (raydist.plugins): {', '.join(entry_points)}")
    say("\n".join(registered_lines(args.kind)))
    return 0


PLUGINS = Command(
    "plugins",
    "every registered name per kind (tasks, encoders, losses, converters, hooks, benchmarks) and the "
    "module that registered it, with the --plugin ones",
    add_arguments,
    run,
)
