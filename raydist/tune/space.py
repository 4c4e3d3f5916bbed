"""Search-space files (``tune_spaces/*.yaml``, installed as ``raydist.tune_spaces``): find them by path or
name, parse and check them against the config before any Ray work starts. Ray-free; ``raydist.tune.sweep``
turns a ``SweepSpace`` into a Tuner."""

from __future__ import annotations

import itertools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from raydist.config import (
    Config,
    ConfigError,
    apply_overrides,
    describe_errors,
    field_annotation,
    flatten,
    is_finite_number,
    key_suggestion,
    load_config,
    resolve_plugins,
    valid_keys,
    validate,
)
from raydist.dataset_task import dataset_task
from raydist.plugins import load_plugins

DISTRIBUTIONS = ("choice", "grid", "uniform", "loguniform", "randint")
# Keys the sweep itself sets for every trial: never swept.
SWEEP_OWNED = {"data.path": "--data", "train.storage_path": "--storage", "train.run_name": "the trial folder"}
# The repository's tune_spaces/ folder, installed as this package (setup.py maps it).
SHIPPED_SPACES = "raydist.tune_spaces"


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


class _FileSection(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Scheduler(_FileSection):
    """``asha`` (early stopping on ``epoch``) or ``fifo`` (every trial runs all epochs). In a space file:
    ``scheduler: fifo``, or a mapping with ``type`` (default asha) and asha's settings."""

    model_config = ConfigDict(validate_by_name=True)

    kind: Literal["asha", "fifo"] = Field("asha", alias="type")
    max_t: PositiveInt | None = None  # epochs; None = train.epochs of the base config
    grace_period: PositiveInt = 1  # epochs every trial runs before it may be stopped
    reduction_factor: float = Field(4.0, gt=1)

    @model_validator(mode="before")
    @classmethod
    def _named(cls, data: Any) -> Any:
        return {"type": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _fifo_alone(self) -> Scheduler:
        if self.kind == "fifo" and self.model_fields_set != {"kind"}:
            raise ValueError(f"fifo takes no other keys, got {sorted(self.model_fields_set - {'kind'})}")
        return self


class _Resources(_FileSection):
    """``resources:`` of each trial; the worker settings are checked by the config they set."""

    trial_cpus: float = Field(0.5, gt=0)  # logical CPUs of the trial's driver function (Tune trial actor)
    num_workers: Any = None
    cpus_per_worker: Any = None
    use_gpu: Any = None


# `resources:` entries that are config fields, and the field each one sets.
RESOURCE_FIELDS = {name: f"train.{name}" for name in _Resources.model_fields if name != "trial_cpus"}


class _SpaceFile(_FileSection):
    """A space file's keys (tune_spaces/margin.yaml shows each); ``space`` maps config keys to
    distributions, checked against the config by ``parse_space``."""

    metric: str = "val/rsum"
    mode: Literal["max", "min"] = "max"
    scheduler: Scheduler = Scheduler()
    search: Literal["random", "grid", "optuna"] = "random"
    num_samples: PositiveInt = 1
    max_concurrent_trials: PositiveInt = 1
    resources: _Resources = _Resources()
    base: dict[str, Any] = {}  # config overrides every trial shares
    space: dict[str, Any] = {}

    @field_validator("resources", "base", mode="before")
    @classmethod
    def _empty(cls, value: Any) -> Any:
        return {} if value is None else value


@dataclass(frozen=True)
class SweepSpace:
    """A parsed space file (defaults: ``_SpaceFile``). ``source`` is the file's mapping, kept so a resumed
    sweep re-reads it."""

    name: str
    params: tuple[Param, ...]
    metric: str
    mode: str
    scheduler: Scheduler
    search: str
    num_samples: int
    max_concurrent_trials: int
    trial_cpus: float  # logical CPUs of each trial's driver function (the Tune trial actor)
    base: dict[str, Any]  # dotted overrides, resources included
    source: dict[str, Any]

    @property
    def keys(self) -> list[str]:
        """The swept config keys, in file order."""
        return [p.key for p in self.params]


def space_names() -> list[str]:
    """Names of the space files shipped with raydist (the repository's ``tune_spaces/``)."""
    try:
        files = resources.files(SHIPPED_SPACES).iterdir()
    except ModuleNotFoundError as e:
        raise ConfigError(
            f"the shipped spaces ({SHIPPED_SPACES}) are not installed with this raydist: install raydist, "
            "or re-run `pip install -e .` in a checkout; or give a space file's path"
        ) from e
    return sorted(p.name[: -len(".yaml")] for p in files if p.name.endswith(".yaml"))


def shipped_space_file(name: str) -> Path:
    """The shipped space file called ``name`` (``margin`` or ``margin.yaml``)."""
    stem = name.removesuffix(".yaml")
    if stem not in space_names():
        raise ConfigError(f"unknown space {name!r}; shipped spaces: {', '.join(space_names())}")
    return Path(resources.files(SHIPPED_SPACES) / f"{stem}.yaml")


def find_space_file(spec: str | Path) -> Path:
    """The file a space argument names: an existing file wins; otherwise a bare name (``margin`` or
    ``margin.yaml``, no folder) is a shipped space; any other path is returned as given."""
    path = Path(spec)
    if path.is_file() or path.name != str(spec):
        return path
    if path.name.removesuffix(".yaml") not in space_names():
        raise ConfigError(
            f"no space file {str(spec)!r} in {Path.cwd()} and no shipped space of that name; "
            f"shipped spaces: {', '.join(space_names())}"
        )
    return shipped_space_file(path.name)


def load_space(spec: str | Path) -> SweepSpace:
    """Read and check a space file, given by path or as a shipped space's name (``find_space_file``); the
    space is named after the file."""
    path = find_space_file(spec)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read space file {path}: {e}") from e
    return parse_space(data, name=path.stem, folder=path.parent)


def parse_space(data: Any, name: str, folder: str | Path | None = None) -> SweepSpace:
    """Check a space mapping (see tune_spaces/margin.yaml for every key) and build a SweepSpace. The plugins
    its ``base`` names (paths relative to ``folder``, the space file's, default the working directory) are
    imported first: a plugin's loss options may be swept."""
    where = f"space {name!r}"
    try:
        file = _SpaceFile.model_validate(data)
    except ValidationError as e:
        lines = describe_errors(e, model=_SpaceFile)
        raise ConfigError("\n".join(f"{where}: {line}" for line in lines)) from e
    if "plugins" in file.base:
        specs = resolve_plugins(file.base["plugins"], folder)
        if specs is None:
            raise ConfigError(
                f"{where}: base.plugins: expected a list of plugin files or modules, got {file.base['plugins']!r}"
            )
        load_plugins(specs)
        data = {**data, "base": {**file.base, "plugins": specs}}
        file = _SpaceFile.model_validate(data)
    if not file.space:
        raise ConfigError(
            f"{where}: 'space' must map config keys to distributions, e.g. "
            "loss.margin: {uniform: [0.05, 0.4]}"
        )
    params = tuple(
        _parse_param(where, key, spec) for key, spec in flatten(file.space, is_leaf=_is_spec).items()
    )
    if file.search == "grid" and any(p.kind != "grid" for p in params):
        raise ConfigError(f"{where}: search: grid needs every space entry to be a 'grid' list")
    if file.search == "optuna" and any(p.kind == "grid" for p in params):
        raise ConfigError(f"{where}: search: optuna cannot run 'grid' entries; use 'choice'")
    base = flatten(file.base)
    misplaced = sorted(set(base) & set(RESOURCE_FIELDS.values()))
    if misplaced:
        raise ConfigError(f"{where}: set {', '.join(misplaced)} under 'resources:', not 'base:'")
    both = sorted(set(base) & {p.key for p in params})
    if both:
        raise ConfigError(f"{where}: {', '.join(both)} both swept and set in 'base:'")
    resources = file.resources
    workers = {RESOURCE_FIELDS[k]: getattr(resources, k) for k in resources.model_fields_set - {"trial_cpus"}}
    return SweepSpace(
        name=name,
        params=params,
        metric=file.metric,
        mode=file.mode,
        scheduler=file.scheduler,
        search=file.search,
        num_samples=file.num_samples,
        max_concurrent_trials=file.max_concurrent_trials,
        trial_cpus=resources.trial_cpus,
        base={**base, **workers},
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
    cfg = load_config(
        preset=preset, preset_file=preset_file, overrides={**space.base, **overrides}, task_of=dataset_task
    )
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
    combos = [
        dict(zip([p.key for p in grid], combo, strict=False))
        for combo in itertools.product(*(p.args for p in grid))
    ]
    return [_checked(space, base, values) for values in singles + combos]


def _checked(space: SweepSpace, base: Config, values: dict[str, Any]) -> Config:
    try:
        return trial_config(base, values)
    except ConfigError as e:
        shown = ", ".join(f"{k}={v!r}" for k, v in values.items())
        raise ConfigError(f"space {space.name!r}: {shown} cannot run: {e}") from e


def _is_spec(value: Mapping[str, Any]) -> bool:
    """A parameter's spec (``{uniform: [lo, hi]}``, or a malformed one) rather than a section of keys: no
    value of it is itself a mapping."""
    return not any(isinstance(v, Mapping) for v in value.values())


def _parse_param(where: str, key: str, spec: Any) -> Param:
    problem = _param_problem(key, spec)
    if problem:
        raise ConfigError(f"{where}: {problem}")
    ((kind, args),) = spec.items()
    return Param(key, kind, tuple(args))


def _param_problem(key: str, spec: Any) -> str | None:
    """Why ``key: spec`` cannot be swept: not a sweepable config key, not one distribution with a
    non-empty list, or a range the field cannot hold (see ``_range_problem``)."""
    if key not in valid_keys():
        return f"{key!r} is not a config key; {key_suggestion(key)}"
    if key in RESOURCE_FIELDS.values():
        return f"{key} sets trial resources and cannot be swept; set it under 'resources:'"
    if key in SWEEP_OWNED:
        return f"{key} is set by the sweep ({SWEEP_OWNED[key]}) and cannot be swept"
    if not isinstance(spec, Mapping) or len(spec) != 1:
        return f"{key} needs exactly one distribution, one of {', '.join(DISTRIBUTIONS)}; got {spec!r}"
    ((kind, args),) = spec.items()
    if kind not in DISTRIBUTIONS:
        return f"{key}: unknown distribution {kind!r}; use one of {', '.join(DISTRIBUTIONS)}"
    if not isinstance(args, list) or not args:
        return f"{key}: {kind} needs a non-empty list, got {args!r}"
    return _range_problem(key, kind, args) if kind in ("uniform", "loguniform", "randint") else None


def _range_problem(key: str, kind: str, args: list[Any]) -> str | None:
    """[low, high] numbers with low < high (low > 0 for loguniform), on a field that can hold what the
    range draws: ints for randint, floats otherwise."""
    want = int if kind == "randint" else float
    held = _held_types(key)
    if not held & ({float} if want is float else {int, float}):
        names = "/".join(sorted(t.__name__ for t in held))
        return f"{key}: {kind} draws {want.__name__}s but {key} holds {names}; use choice or grid"
    numbers_ok = all(is_finite_number(v) and (want is not int or isinstance(v, int)) for v in args)
    if len(args) != 2 or not numbers_ok or not args[0] < args[1]:
        return f"{key}: {kind} needs [low, high] {want.__name__}s with low < high, got {args!r}"
    if kind == "loguniform" and args[0] <= 0:
        return f"{key}: loguniform needs low > 0, got {args!r}"
    return None


def _held_types(key: str) -> set[type]:
    """The types a config field's values have: ``int | None`` → {int}, ``Literal["sum", "mean"]`` → {str},
    ``list[int]`` → {list}."""
    hint = field_annotation(key)
    if typing.get_origin(hint) is Literal:
        return {type(v) for v in typing.get_args(hint)}
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return {typing.get_origin(t) or t for t in members if t is not type(None)}
