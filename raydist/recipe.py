"""The run config `raydist train --data DIR` builds: preset (named, or picked from the dataset's shape), preset
file, the image rules that follow from the data, and the user's overrides on top. One function for the CLI, the
benchmarks and `--auto`, so "the defaults" mean the same run everywhere."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raydist.config import Config, chosen_preset, load_config
from raydist.data import RaydistDataError, dataset_task, load_manifest
from raydist.data.manifest import Manifest
from raydist.data.remote import data_location, local_dataset
from raydist.data.shape import dataset_shape
from raydist.models.image_encoders import import_problem
from raydist.presets import image_encoder_for_data, preset_for_data


@dataclass(frozen=True)
class RunRecipe:
    """A run's config and the console lines that say what was chosen for it from the data, and why."""

    config: Config
    preset: str | None
    lines: list[str] = field(default_factory=list)


def data_task(data: str | Path) -> str | None:
    """The task of ``data`` (a dataset folder, a WebDataset folder or a URI of either: its local dataset,
    :func:`raydist.data.remote.local_dataset`); None without data."""
    return dataset_task(local_dataset(data)) if data else None


def data_preset(
    data: str | Path | None,
    preset: str | None,
    preset_file: str | Path | None,
    *,
    manifest: Manifest | None = None,
) -> tuple[str | None, str]:
    """The shipped preset a run starts from and the line saying why ("" when it was named or is the default
    without data): the one named; none for a preset file alone; with ``data`` and neither, the one the dataset's
    shape picks (:func:`raydist.presets.preset_for_data`); else the default. ``manifest``: the dataset's, when
    read already."""
    if preset or preset_file or not data:
        return chosen_preset(preset, preset_file), ""
    choice = preset_for_data(dataset_shape(local_dataset(data), manifest=manifest))
    return choice.name, choice.line()


def image_rules(
    cfg: Config, overrides: Mapping[str, Any], *, manifest: Manifest | None = None
) -> tuple[dict[str, Any], str]:
    """The keys an encoded-images dataset adds to ``cfg`` and their line ("" when none):

    - no image encoder named (``linear``, which takes vectors): the one
      :func:`raydist.presets.image_encoder_for_data` picks from the images;
    - an encoder trained from scratch (picked *or* named, no ``model.image_weights``): at least
      :data:`raydist.presets.FROM_SCRATCH_MIN_STEPS` optimizer steps, unless the preset's own floor is as high,
      and on a small set early stopping on the val metric (unless the preset sets a patience).

    Keys in ``overrides`` (the command line) stay the user's, and an explicit ``train.epochs`` there gets no
    step floor. ``manifest``: the dataset's, when read already."""
    data = cfg.data.path
    if not data:
        return {}, ""
    manifest = manifest or load_manifest(local_dataset(data))
    if manifest.image_format != "encoded":
        return {}, ""
    named = cfg.model.image_encoder != "linear"
    train = manifest.splits["train"]
    choice = image_encoder_for_data(
        manifest.image_size,
        manifest.image_channels or 3,
        torchvision=not named and import_problem("torchvision.models") is None,
        named=cfg.model.image_encoder if named else None,
        pretrained=bool(cfg.model.image_weights),
        train_images=train.images or train.rows,
        steps_per_epoch=int(train.rows * cfg.data.train_fraction) // cfg.train.batch_size,
    )
    picked = {k: v for k, v in choice.overrides.items() if k not in overrides}
    if cfg.train.early_stop_patience is not None:  # the preset's or preset file's own
        picked.pop("train.early_stop_patience", None)
    if picked.get("train.min_steps", 0) <= cfg.train.min_steps or "train.epochs" in overrides:
        picked.pop("train.min_steps", None)  # the preset's own floor is as high, or the user set the epochs
    if not picked:
        return {}, ""
    return picked, dataclasses.replace(choice, overrides=picked).line()


def _readable_manifest(data: str | Path | None) -> Manifest | None:
    """The manifest of the dataset ``data`` names, or None without data or a readable one (the run's full
    check of the dataset says later what is wrong)."""
    if not data:
        return None
    try:
        return load_manifest(local_dataset(data))
    except (RaydistDataError, OSError, ValueError):
        return None


def run_recipe(
    data: str | Path | None = None,
    *,
    preset: str | None = None,
    preset_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> RunRecipe:
    """The Config of ``raydist train [--data DATA] [--preset …] [--preset-file …] [key=value …]``: the preset
    (:func:`data_preset`), then :func:`image_rules`, then ``overrides`` (which win). ``overrides`` are dotted
    keys as :func:`raydist.config.run_overrides` gives them (``data.path`` included when ``data`` is set)."""
    overrides = dict(overrides or {})
    if data and "data.path" not in overrides:
        overrides["data.path"] = data_location(data)
    manifest = _readable_manifest(data)  # read once for the choices below
    task_of = data_task if manifest is None else (lambda _: manifest.task)
    name, preset_line = data_preset(data, preset, preset_file, manifest=manifest)
    lines = [preset_line] if preset_line else []
    cfg = load_config(preset=name, preset_file=preset_file, overrides=overrides, task_of=task_of)
    picked, line = image_rules(
        cfg, overrides, manifest=manifest if cfg.data.path == overrides.get("data.path") else None
    )
    if picked:
        cfg = load_config(
            preset=name, preset_file=preset_file, overrides={**picked, **overrides}, task_of=task_of
        )
        lines.append(line)
    return RunRecipe(cfg, name, lines)
