"""Typed run configuration: dataclass defaults, YAML presets and dotted ``key=value`` overrides.

The dataclasses below are the single source of defaults; presets, CLI overrides and Tune spaces all
address the same dotted keys (``loss.margin``, ``train.batch_size`` ...).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

AMP_MODES = ("none", "bf16", "fp16")


class ConfigError(ValueError):
    """A configuration that cannot be run: unknown key, wrong type or impossible combination."""


@dataclass
class DataSection:
    """Where the dataset lives and how batches are formed."""

    path: str = ""  # dataset folder; "" = the embedded default synthetic dataset (cached)
    shuffle_buffer: int = 1024  # rows in each worker's local shuffle buffer (0 = no shuffle)
    max_caption_len: int = 48  # tokens kept per caption, <start>/<end> included


@dataclass
class ModelSection:
    """Joint embedding model (VSE++): linear image projection + GRU text encoder."""

    embed_dim: int = 1024  # joint space dimension (= GRU hidden size)
    word_dim: int = 300
    num_layers: int = 1
    no_imgnorm: bool = False  # VSE0 option: do not L2-normalise image embeddings


@dataclass
class LossSection:
    """Ranking loss (DESIGN.md §4) and the cross-worker negative set (DESIGN.md §3)."""

    margin: float = 0.2
    hardest: bool = True  # True = MH (VSE++), False = SH (VSE0)
    warmup_sh_epochs: int = 0  # epochs of SH before switching to MH
    reduction: str = "sum"  # "sum" (VSE++) or "mean"
    similarity: str = "dot"  # "dot" or "order"
    gather: bool = True  # mine negatives from the global batch of all workers
    negative_set_size: int | None = None  # None = the global batch


@dataclass
class TrainSection:
    """Optimisation, workers, checkpoints and logging."""

    epochs: int = 30
    batch_size: int = 128  # GLOBAL batch (all workers together); split equally across workers
    lr: float = 2e-4
    lr_decay_epoch: int = 15  # lr *= lr_decay_factor at this epoch (VSE++ lr_update)
    lr_decay_factor: float = 0.1
    grad_clip: float = 2.0  # max grad norm; 0 disables
    seed: int = 0
    num_workers: int = 2  # Ray Train workers; 0 = in-process local mode
    use_gpu: bool = False
    amp: str = "none"  # mixed precision for the encoders: "none", "bf16" or "fp16" (loss stays fp32)
    cpus_per_worker: float = 0.5  # logical CPUs per worker; leave some for Ray Data
    checkpoint_every: int = 0  # also checkpoint every N steps (0 = per epoch only)
    max_failures: int = 0  # Ray Train FailureConfig(max_failures)
    keep_checkpoints: int = 2
    log_every: int = 10  # steps between progress lines
    storage_path: str = ""  # "" = ./runs (local); shared storage on multi-node clusters
    run_name: str = ""  # "" = a fresh unique name; a stable name resumes
    fail_at_step: int = -1  # fault injection: worker `fail_rank` exits hard at this global step
    fail_rank: int = 0


@dataclass
class EvalSection:
    """Validation/test retrieval evaluation."""

    folds: int = 1  # 5 = COCO 1K protocol
    batch_size: int = 512  # rows per embedding forward pass


@dataclass
class Config:
    """A complete raydist run configuration."""

    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    loss: LossSection = field(default_factory=LossSection)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)

    def to_dict(self) -> dict[str, Any]:
        """Nested plain dict (YAML/JSON serialisable)."""
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """``{"section.field": value}`` for every field."""
        return {f"{s}.{k}": v for s, sec in self.to_dict().items() for k, v in sec.items()}


def valid_keys() -> list[str]:
    """Every dotted key a preset, override or Tune space may set."""
    return sorted(Config().flat())


def _field_type(section: Any, name: str) -> Any:
    hints = typing.get_type_hints(type(section))
    return hints[name]


def coerce(key: str, value: Any, typ: Any) -> Any:
    """Convert ``value`` (a YAML scalar or CLI string) to ``typ`` or raise ConfigError naming ``key``."""
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        return coerce(key, value, args[0])
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value) if typ is not str else value
        except yaml.YAMLError as e:
            raise ConfigError(f"{key}: cannot parse {value!r}: {e}") from e
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if typ is int:
        if isinstance(value, bool) or not (
            isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        ):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return int(value)
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if typ is str:
        if value is None:
            raise ConfigError(f"{key}: expected a string, got null")
        return str(value)
    raise ConfigError(f"{key}: unsupported type {typ}")


def apply_overrides(cfg: Config, overrides: Mapping[str, Any]) -> Config:
    """Return a copy of ``cfg`` with dotted keys set; unknown keys raise with the valid list."""
    cfg = dataclasses.replace(cfg, **{s: dataclasses.replace(getattr(cfg, s)) for s in _sections()})
    for key, value in overrides.items():
        section_name, _, name = key.partition(".")
        section = getattr(cfg, section_name, None) if section_name in _sections() else None
        if section is None or not name or name not in {f.name for f in dataclasses.fields(section)}:
            raise ConfigError(
                f"unknown config key {key!r}; valid keys are:\n  " + "\n  ".join(valid_keys())
            )
        setattr(section, name, coerce(key, value, _field_type(section, name)))
    return cfg


def _sections() -> list[str]:
    return [f.name for f in dataclasses.fields(Config)]


def flatten(nested: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"loss": {"margin": 0.1}}`` → ``{"loss.margin": 0.1}`` (dotted keys pass through)."""
    out: dict[str, Any] = {}
    for k, v in nested.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def from_dict(nested: Mapping[str, Any]) -> Config:
    """Build a Config from a (possibly partial) nested or dotted mapping."""
    return apply_overrides(Config(), flatten(nested))


def parse_overrides(items: list[str]) -> dict[str, str]:
    """Parse CLI ``key=value`` words."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form section.key=value")
        out[key.strip()] = value
    return out


def preset_names() -> list[str]:
    """Names of the presets shipped in raydist/presets/."""
    files = resources.files("raydist.presets").iterdir()
    return sorted(p.name[: -len(".yaml")] for p in files if p.name.endswith(".yaml"))


def load_preset_file(path: str | Path) -> dict[str, Any]:
    """Read a preset YAML file into dotted keys."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read preset file {path}: {e}") from e
    if not isinstance(data, Mapping):
        raise ConfigError(f"preset file {path}: expected a mapping of config keys")
    return flatten(data)


def load_config(
    preset: str | None = None,
    preset_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Defaults ← shipped preset ← preset file ← overrides, then validated."""
    values: dict[str, Any] = {}
    if preset:
        if preset not in preset_names():
            raise ConfigError(f"unknown preset {preset!r}; shipped presets: {', '.join(preset_names())}")
        values.update(load_preset_file(resources.files("raydist.presets") / f"{preset}.yaml"))
    if preset_file:
        values.update(load_preset_file(preset_file))
    values.update(overrides or {})
    cfg = apply_overrides(Config(), values)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Refuse impossible combinations before any Ray work starts."""
    problems = []
    t, lo = cfg.train, cfg.loss
    workers = max(t.num_workers, 1)
    if t.batch_size < 2:
        problems.append(f"train.batch_size={t.batch_size}: need at least 2 rows for negatives")
    if t.batch_size % workers:
        problems.append(
            f"train.batch_size={t.batch_size} is the global batch and must divide evenly over "
            f"train.num_workers={t.num_workers}"
        )
    if lo.negative_set_size is not None:
        if lo.negative_set_size < 2:
            problems.append(f"loss.negative_set_size={lo.negative_set_size}: must be >= 2 (or null)")
        elif lo.negative_set_size > t.batch_size and lo.negative_set_size % workers:
            problems.append(
                f"loss.negative_set_size={lo.negative_set_size} > batch size must divide evenly over "
                f"train.num_workers={t.num_workers}"
            )
    if lo.margin < 0:
        problems.append(f"loss.margin={lo.margin}: must be >= 0")
    if lo.reduction not in ("sum", "mean"):
        problems.append(f"loss.reduction={lo.reduction!r}: expected 'sum' or 'mean'")
    if lo.similarity not in ("dot", "order"):
        problems.append(f"loss.similarity={lo.similarity!r}: expected 'dot' or 'order'")
    if t.amp not in AMP_MODES:
        problems.append(f"train.amp={t.amp!r}: expected one of {', '.join(AMP_MODES)}")
    if t.epochs < 1:
        problems.append(f"train.epochs={t.epochs}: must be >= 1")
    if t.lr <= 0:
        problems.append(f"train.lr={t.lr}: must be > 0")
    if t.num_workers < 0:
        problems.append(f"train.num_workers={t.num_workers}: must be >= 0")
    if t.cpus_per_worker <= 0:
        problems.append(f"train.cpus_per_worker={t.cpus_per_worker}: must be > 0")
    if cfg.eval.folds < 1:
        problems.append(f"eval.folds={cfg.eval.folds}: must be >= 1")
    for key in ("model.embed_dim", "model.word_dim", "model.num_layers", "data.max_caption_len"):
        section, name = key.split(".")
        if getattr(getattr(cfg, section), name) < 1:
            problems.append(f"{key} must be >= 1")
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))


def dump_yaml(cfg: Config) -> str:
    """The config as a nested YAML document (loadable as a preset file)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
