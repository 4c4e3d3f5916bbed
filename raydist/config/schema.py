"""The run config's schema: the sections (typed pydantic models: the one source of defaults, types and per-field
bounds) and :class:`Config`; dotted keys (``loss.margin``, ``train.batch_size``) and their messages.

Presets, CLI overrides, checkpoints and Tune spaces all address these dotted keys. Why pydantic: it validates
nested typed models (lists, optionals, literals, bounds) with errors that carry the field's location, which we
turn into messages naming the dotted key; it ships with Ray already. The ``loss`` section is built from the
registered loss kinds (:mod:`raydist.config.loss`).
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any, Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError, field_validator
from pydantic.fields import FieldInfo

from raydist.config.base import ConfigError, Section, describe_errors, dotted_key
from raydist.config.loss import LOSS_KINDS, LossSectionBase

AMP_MODES = ("none", "bf16", "fp16")
TOP_LEVEL_KEYS = ("plugins",)  # config keys outside any section


class DataSection(Section):
    """Where the dataset lives and how batches are formed."""

    path: str = ""  # dataset folder; "" = the embedded default synthetic dataset (cached)
    shuffle_buffer: int = Field(1024, ge=0)  # rows in each worker's local shuffle buffer (0 = no shuffle)
    max_caption_len: int = Field(48, ge=1)  # tokens kept per caption, <start>/<end> included
    # A train split whose features take at most this many MiB is read once into every worker's memory and
    # reshuffled each epoch; larger ones stream through Ray Data. 0 = always stream.
    in_memory_max_mb: int = Field(512, ge=0)
    # labels task: flip each train label with this probability to a uniform other class as it is read
    # (by sample id, so every worker and epoch agrees); evaluation always uses the clean labels
    label_noise: float = Field(0.0, ge=0, lt=1)
    noise_seed: int = 0
    # train on this fraction of the train split: whole images (all their captions) or samples, chosen by id
    train_fraction: float = Field(1.0, gt=0, le=1)
    # encoded images: the side of the square train crop and eval centre crop; null = the shorter side of the
    # manifest's median image size, at most 224
    image_size: int | None = Field(None, ge=1)
    # encoded images: random left-right flips in training; "auto" = decided from the data (raydist.data.mirror:
    # off where mirrored images look unlike the data -- digits, text, halves -- or captions name left/right)
    flip: bool | Literal["auto"] = "auto"
    # encoded images: the train crop. "pad" = pad by data.crop_pad pixels, then a random window at the image's own
    # size (CIFAR's recipe); "resized" = Inception's random resized crop of data.crop_scale of the area (ImageNet's);
    # "none" = the whole image; "auto" = pad for images up to 64 px, resized for larger ones
    crop: Literal["auto", "resized", "pad", "none"] = "auto"
    crop_pad: int | None = Field(
        None, ge=1
    )  # "pad" crops: pixels of padding; null = an eighth of the crop side
    # encoded images, "resized" crops: the area as a fraction of the image, drawn from [lo, hi] (torchvision's
    # RandomResizedCrop scale; (0.08, 1) is the ImageNet recipe)
    crop_scale: tuple[float, float] = (0.08, 1.0)
    # captions → token ids: "vocab" (the dataset's word vocabulary), "subword" (the dataset's tokenizer.json,
    # from `raydist tokenizer train|set`), "auto" = subword when the dataset has one and the text encoder is not gru
    tokenizer: Literal["auto", "vocab", "subword"] = "auto"
    # a streamed train split's Ray Data transform (read + decode/tokenise, map_batches): logical CPUs per task and
    # at most this many tasks at once; null = Ray Data's defaults (1 CPU per task, as many as the cluster fits)
    transform_cpus: float | None = Field(None, gt=0)
    transform_concurrency: int | None = Field(None, ge=1)


class ModelSection(Section):
    """Encoders: VSE++ (linear image projection + GRU text) for ``pairs``, an MLP for ``labels``."""

    embed_dim: int = Field(1024, ge=1)  # joint space dimension (= GRU hidden size)
    word_dim: int = Field(300, ge=1)
    num_layers: int = Field(1, ge=1)
    no_imgnorm: bool = False  # VSE0 option: do not L2-normalise image embeddings
    mlp_hidden: list[int] = Field(default_factory=lambda: [256])  # labels task: MLP hidden layer widths
    # Matryoshka: train every prefix z[:, :m] (re-normalised) for m in this list; [] = no nesting
    nesting: list[int] = Field(default_factory=list)
    # the image side: "linear" (precomputed feature vectors), or for encoded images "small-cnn",
    # "torchvision:<model>", "timm:<model>" (raydist.models.image_encoders)
    image_encoder: str = "linear"
    image_weights: str = ""  # a local state-dict file of the image encoder's backbone ("" = random init)
    # small-cnn: first block's width (doubling per block), blocks, and the side of the grid its last map is
    # averaged over before the head (1 = a global average pool, which forgets where things are)
    cnn_width: int = Field(32, ge=1)
    cnn_depth: int = Field(3, ge=1)
    cnn_grid: int = Field(2, ge=1)
    # the caption side: "gru" (VSE++), "transformer" (torch TransformerEncoder, learned positions), or
    # "hf:<folder or hub name>" (a pretrained HuggingFace AutoModel) (raydist.models.text_encoders)
    text_encoder: str = "gru"
    text_layers: int = Field(2, ge=1)  # transformer: encoder layers
    text_heads: int = Field(4, ge=1)  # transformer: attention heads (text_width must divide by it)
    text_width: int = Field(256, ge=1)  # transformer: token width (d_model); feed-forward 4× that
    text_dropout: float = Field(0.1, ge=0, lt=1)  # transformer: dropout in its layers
    text_pooling: Literal["mean", "cls"] = (
        "mean"  # transformer / hf: masked mean over tokens, or the first token
    )


class TrainSection(Section):
    """Optimisation, workers, checkpoints and logging."""

    epochs: int = Field(30, ge=1)
    min_steps: int = Field(0, ge=0)  # raise train.epochs until the run has at least this many optimizer steps
    # cut every epoch to at most this many optimizer steps (0 = whole epochs): a run whose length does not grow
    # with the dataset (the tiny preset); each epoch still draws its batches from a fresh shuffle of the split
    epoch_steps: int = Field(0, ge=0)
    # stop after N epochs without a better val metric (0 = off); null = the task's default (labels trained on
    # injected data.label_noise: 3; otherwise off)
    early_stop_patience: int | None = Field(None, ge=0)
    batch_size: int = 128  # GLOBAL batch (all workers together); split equally across workers
    lr: float = Field(2e-4, gt=0)
    lr_decay_epoch: int = Field(15, ge=1)  # lr *= lr_decay_factor at this epoch (VSE++ lr_update)
    lr_decay_factor: float = Field(0.1, gt=0)
    # optimisation (raydist.train.optim); the defaults are Adam + StepLR per epoch, as before these keys
    optimizer: Literal["adam", "adamw"] = "adam"  # adamw: decoupled weight decay
    weight_decay: float = Field(
        0.0, ge=0
    )  # on every weight except biases and normalisation layers' parameters
    lr_schedule: Literal["step", "cosine"] = (
        "step"  # step: lr_decay_epoch/factor; cosine: to 0 at the run's end
    )
    warmup_steps: int = Field(0, ge=0)  # linear LR warm-up over this many optimizer steps
    backbone_lr_mult: float = Field(
        1.0, gt=0
    )  # the image encoder's backbone (and an hf: text model) at lr × this
    freeze_backbone_epochs: int = Field(
        0, ge=0
    )  # backbone frozen for the first N epochs, then trained (fine-tuning)
    grad_clip: float = Field(2.0, ge=0)  # max grad norm; 0 disables
    # gradient caching (raydist.train.gradient_caching): the encoders embed each worker's batch without a graph, the
    # loss (cross-worker negatives, miners, nesting) gives the gradients of the embeddings, then the encoders
    # re-run N rows at a time with those gradients: exact gradients, activation memory of N rows (0 = off)
    grad_cache_chunk: int = Field(0, ge=0)
    seed: int = 0
    num_workers: int = Field(2, ge=0)  # Ray Train workers; 0 = in-process local mode
    # elastic: train with any count from min_workers to num_workers, shrinking when nodes go and growing back
    # when they return (null = num_workers: a fixed-size run); the global batch and negative set stay fixed
    min_workers: int | None = Field(None, ge=1)
    elastic_resize_check_s: float = Field(
        60.0, gt=0
    )  # elastic: seconds between looks for capacity to grow into
    # how long a worker group waits for its CPUs/GPUs (at the start, and after a node loss) before the run fails
    capacity_wait_s: float = Field(600.0, gt=0)
    use_gpu: bool = False
    amp: Literal["none", "bf16", "fp16"] = "none"  # mixed precision for the encoders (loss stays fp32)
    tune_malloc: bool = True  # glibc: keep freed memory for the next step instead of faulting it back in
    cpus_per_worker: float = Field(0.5, gt=0)  # logical CPUs per worker; leave some for Ray Data
    checkpoint_every: int = Field(0, ge=0)  # also checkpoint every N steps (0 = per epoch only)
    # Ray Train FailureConfig(max_failures): restarts of the worker group from the last checkpoint after a
    # failure; null = ELASTIC_RETRIES for an elastic run (train.min_workers set: it survives node loss by
    # default), 0 for a fixed-size run (see failure_retries)
    max_failures: int | None = Field(None, ge=0)
    keep_checkpoints: int = Field(2, ge=1)
    log_every: int = Field(10, ge=1)  # steps between progress lines
    tensorboard: bool = True  # TensorBoard event files in the run folder (rank 0)
    mlflow_uri: str = ""  # also log to this MLflow tracking URI ("" = off; needs `pip install mlflow`)
    storage_path: str = ""  # "" = ./runs (local); shared storage on multi-node clusters
    storage_shared: bool = (
        False  # a local storage_path that every node mounts (NFS): allowed on multi-node clusters
    )
    run_name: str = ""  # "" = a fresh unique name; a stable name resumes


class EvalSection(Section):
    """Validation/test evaluation."""

    folds: int = Field(1, ge=1)  # pairs: 5 = COCO 1K protocol
    batch_size: int = Field(512, ge=1)  # rows per embedding forward pass
    recall_at: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])  # labels: Recall@K values reported


class GCSection(Section):
    """Gradient clustering (Faghri et al. 2020): per-layer rank-1 cluster statistics of per-example gradients,
    sharded over workers. Needs an in-memory train split; the labels task's cross-entropy is the exact
    setting, ranking/metric losses use each row's contribution (a heuristic)."""

    measure: bool = False  # GC statistics + the variance meter; training batches untouched
    sample: bool = False  # train on GC-stratified batches with unbiased weights (implies measure)
    num_clusters: int = Field(10, ge=1)
    mode: Literal["online", "batch"] = "online"
    update_every: int = Field(10, ge=1)  # online mode: statistics steps between U-steps
    # training steps between statistics steps (1 = every step): with k, GC captures and assigns the rows of
    # every k-th step only, a k-times thinner sample of the same stream, and costs ~1/k of a statistics step
    stats_every: int = Field(1, ge=1)
    reassign_every: int = Field(1, ge=0)  # epochs between full reassignment passes over the shard (0 = never)
    log_every: int = Field(50, ge=1)  # steps between variance measurements
    variance_batches: int = Field(10, ge=2)  # T extra mini-batches (from a separate stream) per measurement


class DebugSection(Section):
    """Fault injection for tests and chaos drills (a hook outside the training loop, off by default)."""

    fail_at_step: int = -1  # worker `fail_rank` exits hard once at this global step (-1 = never)
    fail_rank: int = Field(0, ge=0)
    step_delay_s: float = Field(
        0.0, ge=0
    )  # every worker sleeps this long before each step (a slow run for drills)


class Config(Section):
    """A complete raydist run configuration."""

    data: DataSection = Field(default_factory=DataSection)
    model: ModelSection = Field(default_factory=ModelSection)
    loss: LossSectionBase = Field(default_factory=LossSectionBase)  # + every loss kind's options
    train: TrainSection = Field(default_factory=TrainSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    gc: GCSection = Field(default_factory=GCSection)
    debug: DebugSection = Field(default_factory=DebugSection)
    # plugins imported before anything is built, in the driver and in every Ray process of the run
    # (raydist.plugins): .py files, package folders (stored as absolute paths) or module names
    plugins: list[str] = Field(default_factory=list)
    # a train.min_steps that an explicit train.epochs set above it turned off (load_config: the layer that sets
    # train.epochs wins over a lower one's min_steps); kept only to say what it would have done
    _unapplied_min_steps: int = PrivateAttr(0)

    @field_validator("plugins", mode="before")
    @classmethod
    def _one_plugin(cls, value: Any) -> Any:
        """``plugins=my_loss.py`` (one name) means ``[my_loss.py]``."""
        return [value] if isinstance(value, str) else value

    def to_dict(self) -> dict[str, Any]:
        """Nested plain dict (YAML/JSON serialisable)."""
        return self.model_dump()

    def flat(self) -> dict[str, Any]:
        """``{"section.field": value}`` for every field."""
        return flatten(self.to_dict())


def _use_loss_section(section: type[LossSectionBase]) -> None:
    """Make ``section`` (the registered loss kinds' keys, :mod:`raydist.config.loss`) the config's ``loss``."""
    Config.model_fields["loss"] = FieldInfo(annotation=section, default_factory=section)
    Config.model_rebuild(force=True)


LOSS_KINDS.on_change(_use_loss_section)


def valid_keys() -> list[str]:
    """Every dotted key a preset, override or Tune space may set."""
    return sorted(Config().flat())


def field_annotation(key: str) -> Any:
    """The type annotation of a dotted config key (e.g. ``int | None``)."""
    section, _, name = key.partition(".")
    if not name:  # a top-level key (plugins)
        return Config.model_fields[section].annotation
    return Config.model_fields[section].annotation.model_fields[name].annotation


def key_suggestion(key: str) -> str:
    """For a key that is not a config key: the closest valid keys, else the keys of its section, else the
    sections (``did you mean: loss.margin?``)."""
    close = difflib.get_close_matches(key, valid_keys(), n=3, cutoff=0.6)
    section = key.partition(".")[0] + "."
    nearby = close or [k for k in valid_keys() if k.startswith(section)]
    if nearby:
        return f"did you mean: {', '.join(nearby)}?"
    return f"sections: {', '.join(Config.model_fields)}"


def unknown_key_error(key: str) -> ConfigError:
    """An unknown key's error, with :func:`key_suggestion`."""
    return ConfigError(f"unknown config key {key!r}; {key_suggestion(key)}")


def parse_text(key: str, value: Any) -> Any:
    """A CLI/YAML string becomes the YAML value it spells (``3``, ``true``, ``[8, 16]``, ``null``), except
    for string fields; ``none``/``""`` mean null for optional fields."""
    if not isinstance(value, str):
        return value
    annotation = field_annotation(key)
    if annotation is str:
        return value
    if "None" in str(annotation) and value.strip().lower() in ("none", "null", ""):
        return None
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError as e:
        raise ConfigError(f"{key}: cannot parse {value!r}: {e}") from e


def config_error(e: ValidationError) -> ConfigError:
    """An unknown key names the closest valid keys; other problems get one line each."""
    unknown = next((err for err in e.errors() if err["type"] == "extra_forbidden"), None)
    if unknown:
        return unknown_key_error(dotted_key(unknown["loc"]))
    return ConfigError("\n".join(describe_errors(e)))


def flatten(
    nested: Mapping[str, Any], prefix: str = "", *, is_leaf: Callable[[Mapping[str, Any]], bool] | None = None
) -> dict[str, Any]:
    """``{"loss": {"margin": 0.1}}`` → ``{"loss.margin": 0.1}`` (dotted keys pass through). A mapping for
    which ``is_leaf`` says True is kept as a value (e.g. a Tune space's ``{uniform: [lo, hi]}``)."""
    out: dict[str, Any] = {}
    for k, v in nested.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and not (is_leaf and is_leaf(v)):
            out.update(flatten(v, key + ".", is_leaf=is_leaf))
        else:
            out[key] = v
    return out


def is_finite_number(value: Any) -> bool:
    """A real, finite number that is not a bool (metrics to log or plot, numeric YAML values)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def dump_yaml(cfg: Config) -> str:
    """The config as a nested YAML document (loadable as a preset file)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
