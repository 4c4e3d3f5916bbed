"""A run config from presets, preset files, dotted overrides and saved configs: the loaders, and the one plugin
step they all take first (:func:`import_plugins`: a plugin may add keys, e.g. a loss kind's options).

The loaders: :func:`load_config` (defaults ← shipped preset ← preset file ← overrides, then the cross-field
checks), :func:`apply_overrides` / :func:`from_dict` (a mapping a user wrote, checked strictly) and
:func:`from_saved` (a config raydist wrote). :func:`set_keys` validates dotted keys and imports nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from raydist.config.base import ConfigError, known
from raydist.config.checks import validate
from raydist.config.loss import LOSS_KINDS, loss_kinds, loss_section, option_kinds
from raydist.config.schema import (
    TOP_LEVEL_KEYS,
    Config,
    config_error,
    flatten,
    parse_text,
    unknown_key_error,
)
from raydist.dataset_task import dataset_task
from raydist.plugins import load_entry_points, load_plugins, resolve_spec
from raydist.uris import is_uri

DEFAULT_PRESET = "default"  # what `raydist train` and `raydist tune` start from
DEFAULT_TASK = (
    "pairs"  # the task of the embedded default dataset: the preset part a config gets without a task
)
TASKS_KEY = "tasks"  # a preset's ``tasks: {<task>: {...}}`` block: values only for that task's datasets


def import_plugins(values: Mapping[str, Any]) -> dict[str, Any]:
    """The step every loader takes before it validates dotted ``values``: the installed packages' plugins
    (raydist.plugins entry points) and the ``plugins`` the values name are imported, once per process -- a
    plugin may add keys (a loss kind's options), so every process that builds a config from a mapping (the
    driver, a Ray Train worker, a Tune trial, a loaded checkpoint) has them. Returns the values with their
    plugins as a config holds them (paths made absolute)."""
    load_entry_points()
    values = dict(values)
    if "plugins" in values:
        named = parse_text("plugins", values["plugins"])  # a command line's "[a.py, b.py]"
        plugins = resolve_plugins(named)
        if plugins is not None:
            load_plugins(plugins)
        values["plugins"] = named if plugins is None else plugins  # another shape: validation refuses it
    return values


def set_keys(cfg: Config, values: Mapping[str, Any]) -> Config:
    """A copy of ``cfg`` with dotted keys set (each value validated); unknown keys are refused with the closest
    valid keys. Imports nothing: the keys a plugin adds exist once :func:`import_plugins` has run."""
    nested = cfg.to_dict()
    for key, value in values.items():
        section, _, name = key.partition(".")
        if not name and key in TOP_LEVEL_KEYS:
            nested[key] = parse_text(key, value)
            continue
        fields = (
            Config.model_fields[section].annotation.model_fields if section in Config.model_fields else {}
        )
        if section not in nested or not isinstance(nested[section], dict) or name not in fields:
            raise unknown_key_error(key)
        nested[section][name] = parse_text(key, value)
    try:
        return Config.model_validate(nested)
    except ValidationError as e:
        raise config_error(e) from e


def apply_overrides(cfg: Config, overrides: Mapping[str, Any]) -> Config:
    """A copy of ``cfg`` with dotted keys set: :func:`import_plugins`, then :func:`set_keys`."""
    return set_keys(cfg, import_plugins(overrides))


def resolve_plugins(value: Any, base: str | Path | None = None) -> list[str] | None:
    """The plugins a ``plugins`` value names (a list, or one name) as a config holds them: paths made absolute
    (relative to ``base``, default the working directory), duplicates dropped; None for a value of another
    shape. Imports nothing."""
    named = [value] if isinstance(value, str) else value
    if not isinstance(named, list) or not all(isinstance(p, str) for p in named):
        return None
    return list(dict.fromkeys(resolve_spec(p, base) for p in named))


def from_dict(nested: Mapping[str, Any]) -> Config:
    """Build a Config from a (possibly partial) nested or dotted mapping."""
    return apply_overrides(Config(), flatten(nested))


def from_saved(nested: Mapping[str, Any]) -> Config:
    """A Config that raydist wrote (a run's config.yaml, the dict a driver hands its Ray workers and trials):
    :func:`import_plugins`, then :func:`set_keys` leaving out the ``loss.<option>`` keys of loss kinds this
    process does not have when the config's own loss kind is one it has (that kind reads none of them). A driver
    lists every loss kind it has loaded -- one imported by a library user's script, say -- and a worker without
    it then still builds the run's config; an option of the run's own kind is never left out."""
    values = import_plugins(flatten(nested))
    kind = values.get("loss.kind", "auto")
    if kind != "auto" and kind not in loss_kinds():
        try:
            known("loss kind", str(kind), loss_kinds())
        except ValueError as e:
            raise ConfigError(f"loss.kind: {e} (is the plugin that registers it named in plugins?)") from e
    options = loss_section().model_fields
    values = {k: v for k, v in values.items() if not (k.startswith("loss.") and k[5:] not in options)}
    return set_keys(Config(), values)


def parse_overrides(items: list[str]) -> dict[str, str]:
    """Parse CLI ``key=value`` words."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form section.key=value")
        out[key.strip()] = value
    return out


def run_overrides(
    items: Sequence[str] = (),
    *,
    data: str | Path | None = None,
    storage: str | None = None,
    name: str | None = None,
    storage_shared: bool = False,
) -> dict[str, Any]:
    """Command-line ``key=value`` words plus the ``--data`` (absolute, or a URI), ``--storage``, ``--name`` and
    ``--storage-shared`` options as the dotted keys they set."""
    out: dict[str, Any] = parse_overrides(list(items))
    if storage_shared:
        out["train.storage_shared"] = True
    if data:  # a URI (s3://, gs://) as it is
        out["data.path"] = str(data) if is_uri(data) else str(Path(data).expanduser().resolve())
    if storage:
        out["train.storage_path"] = storage
    if name:
        out["train.run_name"] = name
    return out


def chosen_preset(
    preset: str | None, preset_file: str | Path | None, default: str | None = DEFAULT_PRESET
) -> str | None:
    """The shipped preset a command starts from: the one named, else ``default`` unless a preset file is
    given (a file alone replaces the default preset)."""
    return preset or (None if preset_file else default)


def preset_names() -> list[str]:
    """Names of the presets shipped in raydist/presets/."""
    files = resources.files("raydist.presets").iterdir()
    return sorted(p.name[: -len(".yaml")] for p in files if p.name.endswith(".yaml"))


def read_preset_file(path: str | Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A preset YAML file as (dotted keys for every task, {task: dotted keys for that task's datasets only})
    — the second from its ``tasks:`` block. Plugin paths in it are relative to the file's folder."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read preset file {path}: {e}") from e
    if not isinstance(data, Mapping):
        raise ConfigError(f"preset file {path}: expected a mapping of config keys")
    data = dict(data)
    blocks = data.pop(TASKS_KEY, None) or {}
    if not isinstance(blocks, Mapping) or not all(isinstance(b, Mapping) for b in blocks.values()):
        raise ConfigError(f"preset file {path}: {TASKS_KEY!r}: expected a mapping of task name → config keys")
    common = flatten(data)
    plugins = resolve_plugins(common.get("plugins"), path.parent)
    if plugins is not None:
        common["plugins"] = plugins
    return common, {str(task): flatten(block) for task, block in blocks.items()}


def load_config(
    preset: str | None = None,
    preset_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    task_of: Callable[[str], str | None] = dataset_task,
) -> Config:
    """Defaults ← shipped preset ← preset file ← overrides, then validated. A preset's ``tasks.<task>`` block
    applies for the dataset's task: ``task_of`` maps the merged ``data.path`` to it (default: the task its
    manifest names); when it answers None (no dataset there yet), the task is :data:`DEFAULT_TASK`. A shipped
    preset's ``loss.<option>`` values reach only a run whose ``loss.kind`` (set, not auto) reads the option
    (:func:`shipped_loss_values`)."""
    files = []
    if preset:
        if preset not in preset_names():
            raise ConfigError(f"unknown preset {preset!r}; shipped presets: {', '.join(preset_names())}")
        files.append(read_preset_file(resources.files("raydist.presets") / f"{preset}.yaml"))
    if preset_file:
        files.append(read_preset_file(preset_file))
    common = {k: v for part, _ in files for k, v in part.items()}
    # first the plugins: a plugin's loss kind decides which of a shipped preset's loss values apply
    merged = import_plugins({**common, **(overrides or {})})
    task = task_of(str(merged.get("data.path") or "")) or DEFAULT_TASK
    layers: list[dict[str, Any]] = []
    for i, (part, blocks) in enumerate(files):
        part = {**part, **blocks.get(task, {})}
        layers.append(shipped_loss_values(part, merged.get("loss.kind")) if preset and i == 0 else part)
    layers.append(dict(overrides or {}))
    values = {k: v for layer in layers for k, v in layer.items()}
    unapplied = _explicit_epochs(values, layers)
    cfg = apply_overrides(Config(), values)
    cfg._unapplied_min_steps = unapplied
    validate(cfg)
    return cfg


def _explicit_epochs(values: dict[str, Any], layers: list[dict[str, Any]]) -> int:
    """An explicit ``train.epochs`` wins over a ``train.min_steps`` from a lower layer (a preset's "at least
    N steps" raises only the preset's own epochs): that min_steps is turned off in ``values`` and returned (the
    run says what it would have done); else 0."""

    def layer_of(key: str) -> int:
        return max((i for i, layer in enumerate(layers) if key in layer), default=-1)

    epochs_at, min_steps_at = layer_of("train.epochs"), layer_of("train.min_steps")
    if not 0 <= min_steps_at < epochs_at:
        return 0
    unapplied = values["train.min_steps"]
    values["train.min_steps"] = 0
    return int(unapplied) if isinstance(unapplied, int | str) and str(unapplied).isdigit() else 0


def shipped_loss_values(values: Mapping[str, Any], kind: Any) -> dict[str, Any]:
    """A shipped preset's dotted ``values`` without the ``loss.<option>`` values that loss kind ``kind`` (a
    registered one, not auto) does not read: the presets tune the shipped losses (e.g. the SH warm-up of the
    ranking loss), and those values are no mistake of a run that picks another loss kind."""
    if not isinstance(kind, str) or kind not in loss_kinds():
        return dict(values)
    read = LOSS_KINDS.get(kind).Options.model_fields
    return {
        key: value
        for key, value in values.items()
        if not (key.startswith("loss.") and option_kinds(key[5:]) and key[5:] not in read)
    }
