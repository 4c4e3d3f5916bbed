"""Search-space files (``tune_spaces/*.yaml``): parse and check them against the config before any
Ray work starts. Ray-free; ``raydist.tune.sweep`` turns a ``SweepSpace`` into a Tuner."""

from __future__ import annotations

import itertools
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raydist.config import (
    Config,
    ConfigError,
    apply_overrides,
    field_annotation,
    flatten,
    load_config,
    valid_keys,
    validate,
)

DISTRIBUTIONS = ("choice", "grid", "uniform", "loguniform", "randint")
SEARCHES = ("random", "grid", "optuna")
SCHEDULERS = ("asha", "fifo")
TOP_LEVEL_KEYS = (
    "metric",
    "mode",
    "scheduler",
    "search",
    "num_samples",
    "max_concurrent_trials",
    "resources",
    "base",
    "space",
)
# `resources:` entries that are config fields, and the field each one sets.
RESOURCE_FIELDS = {
    "num_workers": "train.num_workers",
    "cpus_per_worker": "train.cpus_per_worker",
    "use_gpu": "train.use_gpu",
}
# Keys the sweep itself sets for every trial: never swept.
SWEEP_OWNED = {"data.path": "--data", "train.storage_path": "--storage", "train.run_name": "the trial folder"}


@dataclass(frozen=True)
class Param:
    """One swept config key: ``kind`` is a distribution name, ``args`` its list from the file."""

    key: str
    kind: str
    args: tuple[Any, ...]

    def candidates(self) -> list[Any]:
        """Values to check before the sweep: every listed value, or both ends of a range
        (``randint`` excludes ``high``, like Tune and ``range``)."""
        if self.kind == "randint":
            return [self.args[0], self.args[1] - 1]
        return list(self.args)


@dataclass(frozen=True)
class Scheduler:
    """``asha`` (early stopping on ``epoch``) or ``fifo`` (every trial runs all epochs)."""

    kind: str = "asha"
    max_t: int | None = None  # epochs; None = train.epochs of the base config
    grace_period: int = 1  # epochs every trial runs before it may be stopped
    reduction_factor: float = 4.0


@dataclass(frozen=True)
class SweepSpace:
    """A parsed space file. ``source`` is the file's mapping, kept so a resumed sweep re-reads it."""

    name: str
    params: tuple[Param, ...]
    metric: str = "val/rsum"
    mode: str = "max"
    scheduler: Scheduler = field(default_factory=Scheduler)
    search: str = "random"
    num_samples: int = 1
    max_concurrent_trials: int = 1
    trial_cpus: float = 0.5  # logical CPUs of each trial's driver function (the Tune trial actor)
    base: dict[str, Any] = field(default_factory=dict)  # dotted overrides, resources included
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def keys(self) -> list[str]:
        """The swept config keys, in file order."""
        return [p.key for p in self.params]


def load_space(path: str | Path) -> SweepSpace:
    """Read and check a space file; the space is named after the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read space file {path}: {e}") from e
    return parse_space(data, name=path.stem)


def parse_space(data: Any, name: str) -> SweepSpace:
    """Check a space mapping (see tune_spaces/margin.yaml for every key) and build a SweepSpace."""
    where = f"space {name!r}"
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping with keys {', '.join(TOP_LEVEL_KEYS)}")
    unknown = sorted(set(data) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown top-level key(s) {unknown}; valid: {', '.join(TOP_LEVEL_KEYS)}")
    space = data.get("space")
    if not isinstance(space, Mapping) or not space:
        raise ConfigError(
            f"{where}: 'space' must map config keys to distributions, e.g. "
            "loss.margin: {uniform: [0.05, 0.4]}"
        )
    params = tuple(_parse_param(where, key, spec) for key, spec in _flatten_space(space).items())
    search = _one_of(where, "search", data.get("search", "random"), SEARCHES)
    if search == "grid" and any(p.kind != "grid" for p in params):
        raise ConfigError(f"{where}: search: grid needs every space entry to be a 'grid' list")
    if search == "optuna" and any(p.kind == "grid" for p in params):
        raise ConfigError(f"{where}: search: optuna cannot run 'grid' entries; use 'choice'")
    trial_cpus, resources = _parse_resources(where, data.get("resources") or {})
    base = _mapping(where, "base", data.get("base") or {})
    misplaced = sorted(set(base) & set(RESOURCE_FIELDS.values()))
    if misplaced:
        raise ConfigError(f"{where}: set {', '.join(misplaced)} under 'resources:', not 'base:'")
    both = sorted(set(base) & {p.key for p in params})
    if both:
        raise ConfigError(f"{where}: {', '.join(both)} both swept and set in 'base:'")
    return SweepSpace(
        name=name,
        params=params,
        metric=_typed(where, "metric", data.get("metric", "val/rsum"), str),
        mode=_one_of(where, "mode", data.get("mode", "max"), ("max", "min")),
        scheduler=_parse_scheduler(where, data.get("scheduler", "asha")),
        search=search,
        num_samples=_positive(where, "num_samples", data.get("num_samples", 1), int),
        max_concurrent_trials=_positive(
            where, "max_concurrent_trials", data.get("max_concurrent_trials", 1), int
        ),
        trial_cpus=trial_cpus,
        base={**base, **resources},
        source=dict(data),
    )


def resolve_base_config(
    space: SweepSpace,
    preset: str | None = None,
    preset_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Preset ← preset file ← space ``base``/``resources`` ← command-line overrides, with every
    swept value checked against it (see ``trial_configs``)."""
    overrides = dict(overrides or {})
    swept = sorted(set(overrides) & set(space.keys))
    if swept:
        raise ConfigError(f"space {space.name!r} sweeps {', '.join(swept)}: drop the override(s)")
    cfg = load_config(preset=preset, preset_file=preset_file, overrides={**space.base, **overrides})
    sched = space.scheduler
    if sched.kind == "asha" and sched.grace_period > (sched.max_t or cfg.train.epochs):
        raise ConfigError(
            f"space {space.name!r}: scheduler.grace_period={sched.grace_period} exceeds max_t="
            f"{sched.max_t or cfg.train.epochs} epochs (max_t defaults to train.epochs)"
        )
    trial_configs(space, cfg)
    return cfg


def trial_config(base: Config, values: Mapping[str, Any]) -> Config:
    """The config one trial runs: ``base`` with the sampled ``values`` applied, then validated."""
    cfg = apply_overrides(base, values)
    validate(cfg)
    return cfg


def trial_configs(space: SweepSpace, base: Config) -> list[Config]:
    """The configs the pre-flight checks cover, raising ConfigError on the first invalid one: each
    candidate value of each key on its own, and every combination of the ``grid`` entries (all run)."""
    grid = [p for p in space.params if p.kind == "grid"]
    singles = [{p.key: value} for p in space.params for value in p.candidates()]
    combos = [dict(zip([p.key for p in grid], combo)) for combo in itertools.product(*(p.args for p in grid))]
    return [_checked(space, base, values) for values in singles + combos]


def _checked(space: SweepSpace, base: Config, values: dict[str, Any]) -> Config:
    try:
        return trial_config(base, values)
    except ConfigError as e:
        shown = ", ".join(f"{k}={v!r}" for k, v in values.items())
        raise ConfigError(f"space {space.name!r}: {shown} cannot run: {e}") from e


def _flatten_space(space: Mapping[str, Any]) -> dict[str, Any]:
    """``{loss: {margin: spec}}`` or ``{loss.margin: spec}`` → ``{"loss.margin": spec}``."""
    out: dict[str, Any] = {}
    for key, spec in space.items():
        key = str(key)
        if "." not in key and isinstance(spec, Mapping) and not set(spec) & set(DISTRIBUTIONS):
            out.update({f"{key}.{name}": s for name, s in spec.items()})
        else:
            out[key] = spec
    return out


def _parse_param(where: str, key: str, spec: Any) -> Param:
    if key not in valid_keys():
        raise ConfigError(
            f"{where}: {key!r} is not a config key; valid keys are:\n  " + "\n  ".join(valid_keys())
        )
    if key in RESOURCE_FIELDS.values():
        raise ConfigError(
            f"{where}: {key} sets trial resources and cannot be swept; set it under 'resources:'"
        )
    if key in SWEEP_OWNED:
        raise ConfigError(f"{where}: {key} is set by the sweep ({SWEEP_OWNED[key]}) and cannot be swept")
    if not isinstance(spec, Mapping) or len(spec) != 1:
        raise ConfigError(
            f"{where}: {key} needs exactly one distribution, one of {', '.join(DISTRIBUTIONS)}; got {spec!r}"
        )
    ((kind, args),) = spec.items()
    if kind not in DISTRIBUTIONS:
        raise ConfigError(
            f"{where}: {key}: unknown distribution {kind!r}; use one of {', '.join(DISTRIBUTIONS)}"
        )
    if not isinstance(args, list) or not args:
        raise ConfigError(f"{where}: {key}: {kind} needs a non-empty list, got {args!r}")
    types = _field_types(key)
    if kind in ("uniform", "loguniform", "randint"):
        _check_range(where, key, kind, args, types)
    return Param(key, kind, tuple(args))


def _check_range(where: str, key: str, kind: str, args: list[Any], types: set[type]) -> None:
    """[low, high] numbers with low < high, on a field that can hold what the range draws."""
    want = int if kind == "randint" else float
    fits = {float} if want is float else {int, float}
    if not types & fits:
        raise ConfigError(
            f"{where}: {key}: {kind} draws {want.__name__}s but {key} holds "
            f"{'/'.join(sorted(t.__name__ for t in types))}; use choice or grid"
        )
    if len(args) != 2 or not all(_is_number(v, want) for v in args) or not args[0] < args[1]:
        raise ConfigError(
            f"{where}: {key}: {kind} needs [low, high] {want.__name__}s with low < high, got {args!r}"
        )
    if kind == "loguniform" and args[0] <= 0:
        raise ConfigError(f"{where}: {key}: loguniform needs low > 0, got {args!r}")


def _is_number(value: Any, want: type) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) if want is int else math.isfinite(value)


def _field_types(key: str) -> set[type]:
    """The non-None types a config field holds (``int | None`` → {int})."""
    hint = field_annotation(key)
    return {t for t in (typing.get_args(hint) or (hint,)) if t is not type(None)}


def _parse_scheduler(where: str, spec: Any) -> Scheduler:
    if isinstance(spec, str):
        spec = {"type": spec}
    spec = dict(_mapping(where, "scheduler", spec))
    kind = _one_of(where, "scheduler type", spec.pop("type", "asha"), SCHEDULERS)
    allowed = {"max_t", "grace_period", "reduction_factor"} if kind == "asha" else set()
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: scheduler {kind}: unknown key(s) {unknown}; valid: {sorted(allowed) or 'none'}"
        )
    sched = Scheduler(
        kind=kind,
        max_t=_positive(where, "scheduler.max_t", spec["max_t"], int) if "max_t" in spec else None,
        grace_period=_positive(where, "scheduler.grace_period", spec.get("grace_period", 1), int),
        reduction_factor=_positive(
            where, "scheduler.reduction_factor", spec.get("reduction_factor", 4), float
        ),
    )
    if sched.reduction_factor <= 1:
        raise ConfigError(f"{where}: scheduler.reduction_factor must be > 1, got {sched.reduction_factor}")
    return sched


def _parse_resources(where: str, spec: Any) -> tuple[float, dict[str, Any]]:
    """``trial_cpus`` and the train.* overrides that ``resources:`` sets."""
    spec = dict(_mapping(where, "resources", spec))
    trial_cpus = _positive(where, "resources.trial_cpus", spec.pop("trial_cpus", 0.5), float)
    unknown = sorted(set(spec) - set(RESOURCE_FIELDS))
    if unknown:
        raise ConfigError(
            f"{where}: resources: unknown key(s) {unknown}; valid: trial_cpus, " + ", ".join(RESOURCE_FIELDS)
        )
    return trial_cpus, {RESOURCE_FIELDS[k]: v for k, v in spec.items()}


def _mapping(where: str, what: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: {what} must be a mapping, got {value!r}")
    return flatten(value)


def _typed(where: str, what: str, value: Any, typ: type) -> Any:
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, typ) or isinstance(value, bool):
        raise ConfigError(f"{where}: {what} must be a {typ.__name__}, got {value!r}")
    return value


def _positive(where: str, what: str, value: Any, typ: type) -> Any:
    value = _typed(where, what, value, typ)
    if value <= 0:
        raise ConfigError(f"{where}: {what} must be > 0, got {value!r}")
    return value


def _one_of(where: str, what: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        raise ConfigError(f"{where}: {what} must be one of {', '.join(options)}, got {value!r}")
    return value
