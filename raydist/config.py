"""Typed run configuration: pydantic v2 sections, YAML presets and dotted ``key=value`` overrides.

The models below are the single source of defaults, types and per-field bounds; presets, CLI overrides,
checkpoints and Tune spaces all address the same dotted keys (``loss.margin``, ``train.batch_size`` ...).
Why pydantic: it validates nested typed models (lists, optionals, literals, bounds) with errors that carry
the field's location, which we turn into messages naming the dotted key; it ships with Ray already.
"""

from __future__ import annotations

import copy
import difflib
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
)
from pydantic.fields import FieldInfo

from raydist.choices import DISTANCES, MINER_STRATEGIES, REDUCTIONS, SIMILARITIES
from raydist.dataset_task import dataset_task
from raydist.nesting import check_embedding_dim, check_nesting, check_weights
from raydist.plugins import load_entry_points, load_plugins, resolve_spec
from raydist.uris import is_uri

AMP_MODES = ("none", "bf16", "fp16")
DEFAULT_PRESET = "default"  # what `raydist train` and `raydist tune` start from
DEFAULT_TASK = (
    "pairs"  # the task of the embedded default dataset: the preset part a config gets without a task
)
TOP_LEVEL_KEYS = ("plugins",)  # config keys outside any section
TASKS_KEY = "tasks"  # a preset's ``tasks: {<task>: {...}}`` block: values only for that task's datasets


class ConfigError(ValueError):
    """A configuration that cannot be run: unknown key, wrong type or impossible combination."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataSection(_Section):
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


class ModelSection(_Section):
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


class LossSectionBase(_Section):
    """The loss section's keys every loss kind shares. The section a config holds (:data:`LossSection`) adds the
    options of every registered loss kind (:func:`add_loss_options`): ``loss.<option>`` keys."""

    # "auto" = the task's default (ranking for pairs, cross_entropy for labels), or a registered loss kind
    kind: str = "auto"
    nesting_weights: list[float] = Field(default_factory=list)  # c_m per model.nesting dim; [] = all 1

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        """A registered loss kind (or auto); else the close names."""
        return _known("loss kind", value, ["auto", *_LOSS_OPTIONS])


_MINERS: list[str] = list(MINER_STRATEGIES)  # loss.miner values: the registered miners (raydist.losses)


def _known(what: str, value: str, known: Sequence[str]) -> str:
    """``value`` when it is one of ``known``; else a ValueError naming the close ones, else all of them."""
    if value in known:
        return value
    close = difflib.get_close_matches(value, known, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ValueError(f"unknown {what} {value!r}; {hint}known: {', '.join(known)}")


def _known_miner(value: str) -> str:
    return _known("miner", value, _MINERS)


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoOptions(_Options):
    """A loss kind without options of its own."""


class _MinedOptions(_Options):
    margin: float = Field(0.2, ge=0)  # ranking / triplet margin; the margin loss's alpha
    gather: bool = True  # mine negatives from the global batch of all workers


class RankingOptions(_MinedOptions):
    """``loss.kind=ranking`` (task pairs): VSE++'s hinge ranking loss and its negative set."""

    hardest: bool = True  # True = MH (VSE++, hardest-negative miner), False = SH (all negatives)
    warmup_sh_epochs: int = Field(0, ge=0)  # epochs of SH before switching to MH
    warmup_sh_steps: int = Field(0, ge=0)  # ... at least this many SH steps (raises warmup_sh_epochs)
    stall_fallback: bool = True  # an MH epoch whose loss sits at the collapse value 2·N·margin → one SH epoch
    reduction: Literal[REDUCTIONS] = "sum"  # "sum" (VSE++) or "mean"
    similarity: Literal[SIMILARITIES] = "dot"
    negative_set_size: int | None = None  # None = the global batch
    tile: int = Field(4096, ge=1)  # keys per tile of the hardest-negative miner (memory O(rows · tile))


class MetricOptions(_MinedOptions):
    """The mining options of the triplet and margin losses (task labels)."""

    miner: Annotated[str, AfterValidator(_known_miner)] = "semihard-random"  # a registered miner
    distance: Literal[DISTANCES] = "euclidean"


class TripletOptions(MetricOptions):
    """``loss.kind=triplet`` (task labels)."""

    hinged: bool = True  # triplet: [d_ap − d_an + α]₊ (true) or d_ap − d_an (false)


class MarginOptions(MetricOptions):
    """``loss.kind=margin`` (task labels): Wu et al.'s margin loss with a learnable boundary β."""

    beta: float = 1.2  # margin loss: initial boundary β₀ (learnable)
    beta_per_class: bool = False  # margin loss: one β per class
    nu: float = Field(0.0, ge=0)  # margin loss: ν·β regularisation


# every registered loss kind's options model, in registration order (the shipped kinds first)
_LOSS_OPTIONS: dict[str, type[BaseModel]] = {}
LossSection: type[LossSectionBase] = LossSectionBase  # rebuilt by add_loss_options


def loss_kinds() -> list[str]:
    """The registered loss kinds, in registration order (``auto`` not included)."""
    return list(_LOSS_OPTIONS)


def loss_options(kind: str) -> type[BaseModel]:
    """The options model of a registered loss kind: its fields are the ``loss.<option>`` keys it reads."""
    if kind not in _LOSS_OPTIONS:
        _known("loss kind", kind, list(_LOSS_OPTIONS))
    return _LOSS_OPTIONS[kind]


def option_kinds(option: str) -> list[str]:
    """The registered loss kinds that read ``loss.<option>`` (in registration order)."""
    return [kind for kind, model in _LOSS_OPTIONS.items() if option in model.model_fields]


def _same_field(a: FieldInfo, b: FieldInfo) -> bool:
    """Two declarations of one option agree: type, default and bounds."""
    return (a.annotation, a.metadata, a.get_default(call_default_factory=True)) == (
        b.annotation,
        b.metadata,
        b.get_default(call_default_factory=True),
    )


def add_loss_options(kind: str, options: type[BaseModel] | None = None) -> None:
    """Register loss kind ``kind`` with its options model (``None``: none), whose fields become the config keys
    ``loss.<field>`` (types, defaults and bounds as declared; the loss section is rebuilt). Two kinds may
    share an option only with the same type, default and bounds. Registering the same model again is a
    no-op; called by the loss registry (:mod:`raydist.losses.kinds`), not by users."""
    options = options or NoOptions
    old = _LOSS_OPTIONS.get(kind)
    if old is options:
        return
    if kind == "auto" or old is not None:
        raise ConfigError(f"loss kind {kind!r} is registered already (or reserved); pick another name")
    for name, info in options.model_fields.items():
        if name in LossSectionBase.model_fields:
            raise ConfigError(f"loss kind {kind!r}: option {name!r} is a key every loss shares; rename it")
        for other in option_kinds(name):
            if not _same_field(info, _LOSS_OPTIONS[other].model_fields[name]):
                raise ConfigError(
                    f"loss kind {kind!r}: option loss.{name} differs from loss kind {other!r}'s loss.{name} "
                    "(a shared option needs the same type, default and bounds); rename it"
                )
    _LOSS_OPTIONS[kind] = options
    _rebuild_loss_section()


def remove_loss_options(kind: str) -> None:
    """Undo :func:`add_loss_options` (tests; a plugin's experiment): its options leave the section unless
    another kind reads them."""
    if _LOSS_OPTIONS.pop(kind, None) is not None:
        _rebuild_loss_section()


def add_miner(name: str) -> None:
    """Make ``name`` a valid ``loss.miner`` (called by the miner registry, :mod:`raydist.losses.kinds`)."""
    if name not in _MINERS:
        _MINERS.append(name)


def remove_miner(name: str) -> None:
    """Undo :func:`add_miner` (tests)."""
    if name in _MINERS and name not in MINER_STRATEGIES:
        _MINERS.remove(name)


def _rebuild_loss_section() -> None:
    """:data:`LossSection` = the shared keys + every registered kind's options (first declaration of each, in
    registration order); the :class:`Config` (once defined) takes it as its ``loss`` section."""
    global LossSection
    fields: dict[str, Any] = {}
    for model in _LOSS_OPTIONS.values():
        for name, info in model.model_fields.items():
            fields.setdefault(name, (info.annotation, copy.copy(info)))
    LossSection = create_model(
        "LossSection",
        __base__=LossSectionBase,
        __module__=__name__,
        __doc__=LossSectionBase.__doc__,
        **fields,
    )
    if "Config" in globals():
        Config.model_fields["loss"] = FieldInfo(annotation=LossSection, default_factory=LossSection)
        Config.model_rebuild(force=True)


# the shipped loss kinds' options (their losses, in raydist.losses.kinds, register the same models)
for _kind, _options in (
    ("ranking", RankingOptions),
    ("cross_entropy", NoOptions),
    ("triplet", TripletOptions),
    ("margin", MarginOptions),
):
    add_loss_options(_kind, _options)


class TrainSection(_Section):
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
    # gradient caching (raydist.train.grad_cache): the encoders embed each worker's batch without a graph, the
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


class EvalSection(_Section):
    """Validation/test evaluation."""

    folds: int = Field(1, ge=1)  # pairs: 5 = COCO 1K protocol
    batch_size: int = Field(512, ge=1)  # rows per embedding forward pass
    recall_at: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])  # labels: Recall@K values reported


class GCSection(_Section):
    """Gradient clustering (Faghri et al. 2020): per-layer rank-1 cluster statistics of per-example gradients,
    sharded over workers. Needs an in-memory train split; the labels task's cross-entropy is the exact
    setting, ranking/metric losses use each row's contribution (a heuristic)."""

    measure: bool = False  # GC statistics + the variance meter; training batches untouched
    sample: bool = False  # train on GC-stratified batches with unbiased weights (implies measure)
    num_clusters: int = Field(10, ge=1)
    mode: Literal["online", "batch"] = "online"
    update_every: int = Field(10, ge=1)  # online mode: steps between U-steps
    reassign_every: int = Field(1, ge=0)  # epochs between full reassignment passes over the shard (0 = never)
    log_every: int = Field(50, ge=1)  # steps between variance measurements
    variance_batches: int = Field(10, ge=2)  # T extra mini-batches (from a separate stream) per measurement


class DebugSection(_Section):
    """Fault injection for tests and chaos drills (a hook outside the training loop, off by default)."""

    fail_at_step: int = -1  # worker `fail_rank` exits hard once at this global step (-1 = never)
    fail_rank: int = Field(0, ge=0)
    step_delay_s: float = Field(
        0.0, ge=0
    )  # every worker sleeps this long before each step (a slow run for drills)


class Config(_Section):
    """A complete raydist run configuration."""

    data: DataSection = Field(default_factory=DataSection)
    model: ModelSection = Field(default_factory=ModelSection)
    loss: LossSection = Field(default_factory=LossSection)
    train: TrainSection = Field(default_factory=TrainSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    gc: GCSection = Field(default_factory=GCSection)
    debug: DebugSection = Field(default_factory=DebugSection)
    # plugins imported before anything is built, in the driver and in every Ray process of the run
    # (raydist.plugins): .py files, package folders (stored as absolute paths) or module names
    plugins: list[str] = Field(default_factory=list)

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


def _unknown_key(key: str) -> ConfigError:
    """An unknown key's error, with :func:`key_suggestion`."""
    return ConfigError(f"unknown config key {key!r}; {key_suggestion(key)}")


def _parse_text(key: str, value: Any) -> Any:
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


_MESSAGES = {
    "int_parsing": "expected an integer",
    "int_type": "expected an integer",
    "int_from_float": "expected an integer",
    "bool_parsing": "expected true/false",
    "bool_type": "expected true/false",
    "float_parsing": "expected a number",
    "float_type": "expected a number",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "dataclass_type": "expected a mapping",
}
_BOUNDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
_UNION_TAGS = ("int", "float", "str", "bool", "none")


def _dotted(loc: tuple[int | str, ...]) -> str:
    """``("splits", "train", "shards", 0, "rows")`` → ``splits.train.shards[0].rows``, without the tags
    pydantic adds for union members and validators (``int``, ``function-after[...]``)."""
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        elif part.isidentifier() and part not in _UNION_TAGS:
            key += f".{part}" if key else part
    return key


def _keys_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys (aliases where set) of the model found at ``loc`` inside ``model``; [] past the models."""
    for part in loc:
        info = model.model_fields.get(part) if isinstance(part, str) else None
        model = info.annotation if info else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
    return [info.alias or name for name, info in model.model_fields.items()]


def describe_errors(
    e: ValidationError, label: str = "{key}", model: type[BaseModel] | None = None
) -> list[str]:
    """One line per problem, naming the dotted key (``label`` formats it): ``key: expected an integer, got
    'abc'``, ``key=-1: must be >= 0``, ``key: unknown key; valid: ...`` (the keys ``model`` accepts there)."""
    lines = []
    for err in e.errors():
        kind, got, ctx = err["type"], err.get("input"), err.get("ctx", {})
        key = _dotted(err["loc"])
        name = label.format(key=key)
        if kind in _BOUNDS:
            lines.append(f"{name}={got!r}: must be {_BOUNDS[kind]} {next(iter(ctx.values()), '?')}")
            continue
        if kind == "extra_forbidden":
            valid = _keys_at(model, err["loc"][:-1]) if model else []
            problem = "unknown key" + (f"; valid: {', '.join(valid)}" if valid else "")
        elif kind == "missing":
            problem = "missing"
        elif kind == "value_error":
            problem = str(ctx["error"])
        elif kind == "literal_error":
            problem = f"expected {ctx['expected']}, got {got!r}"
        else:
            problem = f"{_MESSAGES.get(kind, err['msg'])}, got {got!r}"
        lines.append(f"{name}: {problem}" if key else problem)
    return list(dict.fromkeys(lines))


def _config_error(e: ValidationError) -> ConfigError:
    """An unknown key names the closest valid keys; other problems get one line each."""
    unknown = next((err for err in e.errors() if err["type"] == "extra_forbidden"), None)
    if unknown:
        return _unknown_key(_dotted(unknown["loc"]))
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


def apply_overrides(cfg: Config, overrides: Mapping[str, Any]) -> Config:
    """Return a copy of ``cfg`` with dotted keys set (each value validated); unknown keys are refused
    with the closest valid keys. The ``plugins`` a config names (and the installed entry points) are imported first (paths made absolute):
    a plugin may add keys (a loss kind's options), so every process that builds a config from a mapping --
    the driver, a Ray Train worker, a Tune trial, a loaded checkpoint -- has them."""
    nested = cfg.to_dict()
    load_entry_points()  # installed packages' plugins (raydist.plugins entry points), once per process
    if "plugins" in overrides:
        overrides = {**overrides, "plugins": import_named_plugins(overrides["plugins"])}
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        if not name and key in TOP_LEVEL_KEYS:
            nested[key] = _parse_text(key, value)
            continue
        fields = (
            Config.model_fields[section].annotation.model_fields if section in Config.model_fields else {}
        )
        if section not in nested or not isinstance(nested[section], dict) or name not in fields:
            raise _unknown_key(key)
        nested[section][name] = _parse_text(key, value)
    try:
        return Config.model_validate(nested)
    except ValidationError as e:
        raise _config_error(e) from e


def resolve_plugins(value: Any, base: str | Path | None = None) -> list[str] | None:
    """The plugins a ``plugins`` value names (a list, or one name) as a config holds them: paths made absolute
    (relative to ``base``, default the working directory), duplicates dropped; None for a value of another
    shape. Imports nothing."""
    named = [value] if isinstance(value, str) else value
    if not isinstance(named, list) or not all(isinstance(p, str) for p in named):
        return None
    return list(dict.fromkeys(resolve_spec(p, base) for p in named))


def import_named_plugins(value: Any, base: str | Path | None = None) -> Any:
    """Import the plugins a ``plugins`` value names (:func:`resolve_plugins`, a command-line string parsed
    first) and return them as a config holds them; a value of another shape is returned as it is, for
    validation to refuse."""
    value = _parse_text("plugins", value)
    plugins = resolve_plugins(value, base)
    if plugins is None:
        return value
    load_plugins(plugins)
    return plugins


def from_dict(nested: Mapping[str, Any]) -> Config:
    """Build a Config from a (possibly partial) nested or dotted mapping."""
    return apply_overrides(Config(), flatten(nested))


def from_saved(nested: Mapping[str, Any]) -> Config:
    """A Config that raydist wrote (a run's config.yaml, the dict a driver hands its Ray workers and trials):
    :func:`from_dict` after its plugins are imported, leaving out the ``loss.<option>`` keys of loss kinds this
    process does not have when the config's own loss kind is one it has (that kind reads none of them). A driver
    lists every loss kind it has loaded -- one imported by a library user's script, say -- and a worker without
    it then still builds the run's config; an option of the run's own kind is never left out."""
    values = flatten(nested)
    load_entry_points()
    if "plugins" in values:
        values["plugins"] = import_named_plugins(values["plugins"])
    kind = values.get("loss.kind", "auto")
    if kind != "auto" and kind not in _LOSS_OPTIONS:
        try:
            _known("loss kind", str(kind), list(_LOSS_OPTIONS))
        except ValueError as e:
            raise ConfigError(f"loss.kind: {e} (is the plugin that registers it named in plugins?)") from e
    known = LossSection.model_fields
    values = {k: v for k, v in values.items() if not (k.startswith("loss.") and k[5:] not in known)}
    return apply_overrides(Config(), values)


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


def load_preset_file(path: str | Path, task: str = DEFAULT_TASK) -> dict[str, Any]:
    """Read a preset YAML file into dotted keys: its common part, then its ``tasks.<task>`` block."""
    common, blocks = read_preset_file(path)
    return {**common, **blocks.get(task, {})}


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
    merged = {**common, **(overrides or {})}
    if "plugins" in merged:  # a plugin's loss kind decides which of a shipped preset's loss values apply
        import_named_plugins(merged["plugins"])
    task = task_of(str(merged.get("data.path") or "")) or DEFAULT_TASK
    values: dict[str, Any] = {}
    for i, (part, blocks) in enumerate(files):
        part = {**part, **blocks.get(task, {})}
        values.update(shipped_loss_values(part, merged.get("loss.kind")) if preset and i == 0 else part)
    values.update(overrides or {})
    cfg = apply_overrides(Config(), values)
    validate(cfg)
    return cfg


def shipped_loss_values(values: Mapping[str, Any], kind: Any) -> dict[str, Any]:
    """A shipped preset's dotted ``values`` without the ``loss.<option>`` values that loss kind ``kind`` (a
    registered one, not auto) does not read: the presets tune the shipped losses (e.g. the SH warm-up of the
    ranking loss), and those values are no mistake of a run that picks another loss kind."""
    if not isinstance(kind, str) or kind not in _LOSS_OPTIONS:
        return dict(values)
    read = _LOSS_OPTIONS[kind].model_fields
    return {
        key: value
        for key, value in values.items()
        if not (key.startswith("loss.") and option_kinds(key[5:]) and key[5:] not in read)
    }


def validate(cfg: Config) -> None:
    """Refuse combinations of fields that are each valid alone, before any Ray work starts."""
    problems = []
    t, lo = cfg.train, cfg.loss
    workers = max(t.num_workers, 1)
    if t.batch_size < 2:
        problems.append(f"train.batch_size={t.batch_size}: need at least 2 rows for negatives")
    if t.min_workers is not None and (t.num_workers == 0 or t.min_workers > t.num_workers):
        problems.append(
            f"train.min_workers={t.min_workers} must be between 1 and train.num_workers={t.num_workers} "
            "(an elastic run needs Ray Train workers)"
        )
    elif t.batch_size % workers:
        problems.append(
            f"train.batch_size={t.batch_size} is the global batch and must divide evenly over "
            f"train.num_workers={t.num_workers}"
        )
    elif t.min_workers is not None and t.batch_size % (multiple := worker_counts_multiple(t)):
        problems.append(
            f"train.batch_size={t.batch_size} is the global batch and must divide evenly over every worker count "
            f"an elastic run may have (train.min_workers={t.min_workers} … train.num_workers={t.num_workers}): "
            f"use a multiple of {multiple} (e.g. {nearby_multiples(t.batch_size, multiple)}) or raise "
            "train.min_workers"
        )
    if lo.negative_set_size is not None:
        if lo.negative_set_size < 2:
            problems.append(f"loss.negative_set_size={lo.negative_set_size}: must be >= 2 (or null)")
        elif lo.negative_set_size > t.batch_size and lo.negative_set_size % worker_counts_multiple(t):
            problems.append(
                f"loss.negative_set_size={lo.negative_set_size} > batch size must divide evenly over "
                + (
                    f"train.num_workers={t.num_workers}"
                    if t.min_workers is None
                    else f"every worker count from train.min_workers={t.min_workers} to train.num_workers={t.num_workers}"
                )
            )
    if cfg.model.nesting or cfg.loss.nesting_weights:
        try:
            dims = check_nesting(cfg.model.nesting)
            check_embedding_dim(dims, cfg.model.embed_dim)
            check_weights(cfg.loss.nesting_weights or None, len(dims))
        except ValueError as e:
            problems.append(
                f"model.nesting={cfg.model.nesting}, loss.nesting_weights={cfg.loss.nesting_weights}: {e}"
            )
    lo_scale, hi_scale = cfg.data.crop_scale
    if not 0 < lo_scale <= hi_scale <= 1:
        problems.append(
            f"data.crop_scale={list(cfg.data.crop_scale)}: need 0 < lo <= hi <= 1 (area fractions)"
        )
    if any(w < 1 for w in cfg.model.mlp_hidden):
        problems.append(f"model.mlp_hidden={cfg.model.mlp_hidden}: widths must be >= 1")
    m = cfg.model
    if m.text_encoder == "transformer" and m.text_width % m.text_heads:
        problems.append(f"model.text_width={m.text_width} must divide by model.text_heads={m.text_heads}")
    if m.text_encoder.startswith("hf:") and (cfg.gc.measure or cfg.gc.sample):
        problems.append(
            f"gc.* with model.text_encoder={m.text_encoder}: gradient clustering supports the gru and "
            "transformer text encoders, not hf: models (they run layers on inputs shared by the "
            "batch, e.g. BERT's position embeddings on [1, L] ids, and layers the caption path never "
            "uses, e.g. the pooler)"
        )
    if t.grad_cache_chunk and (cfg.gc.measure or cfg.gc.sample):
        problems.append(
            f"train.grad_cache_chunk={t.grad_cache_chunk} with gc.measure/gc.sample: gradient clustering records "
            "each row's gradient from one forward and backward over the batch; gradient caching runs the backward "
            "chunk by chunk on cached embedding gradients (use one or the other)"
        )
    problems += _backbone_problems(cfg)
    if not cfg.eval.recall_at or any(k < 1 for k in cfg.eval.recall_at):
        problems.append(f"eval.recall_at={cfg.eval.recall_at}: need one or more K >= 1")
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))


def epoch_steps(train: TrainSection, full: int) -> int:
    """The steps an epoch trains: its ``full`` steps, or ``train.epoch_steps`` when that is fewer."""
    return min(full, train.epoch_steps) if train.epoch_steps else full


ELASTIC_RETRIES = 3  # an elastic run's restarts after a lost node when train.max_failures is null


def failure_retries(train: TrainSection) -> int:
    """Restarts from the last checkpoint a run gets after a failure: ``train.max_failures``, or when null
    :data:`ELASTIC_RETRIES` for an elastic run (``train.min_workers`` set) and 0 for a fixed-size one."""
    if train.max_failures is not None:
        return train.max_failures
    return ELASTIC_RETRIES if train.min_workers is not None else 0


def worker_counts(train: TrainSection) -> range:
    """The worker counts a run may train with: ``train.min_workers`` … ``train.num_workers`` when elastic, else
    ``train.num_workers`` alone (at least 1: local mode is one process)."""
    top = max(train.num_workers, 1)
    return range(min(train.min_workers or top, top), top + 1)


def worker_counts_multiple(train: TrainSection) -> int:
    """The least common multiple of :func:`worker_counts`: the global rows of a step must be a multiple of it
    so that every worker count splits them equally."""
    return math.lcm(*worker_counts(train))


def nearby_multiples(value: int, multiple: int) -> str:
    """The multiples of ``multiple`` next to ``value`` (``"120 or 126"``), for a refusal message."""
    low = value // multiple * multiple
    return " or ".join(str(v) for v in (low, low + multiple) if v >= multiple)


def _backbone_problems(cfg: Config) -> list[str]:
    """``train.backbone_lr_mult`` / ``train.freeze_backbone_epochs`` set for a model without a backbone: the
    ``linear`` image encoder (features) and a text encoder that is not a pretrained ``hf:`` model."""
    m, t = cfg.model, cfg.train
    if m.image_encoder != "linear" or m.text_encoder.startswith("hf:"):
        return []
    set_keys = [
        f"train.{k}={getattr(t, k)}"
        for k, default in (("backbone_lr_mult", 1.0), ("freeze_backbone_epochs", 0))
        if getattr(t, k) != default
    ]
    return [
        f"{key}: the model has no backbone (model.image_encoder=linear, model.text_encoder={m.text_encoder}); "
        "it applies to an image encoder's backbone (small-cnn, torchvision:<model>, timm:<model>) or an hf: "
        "text model"
        for key in set_keys
    ]


def dump_yaml(cfg: Config) -> str:
    """The config as a nested YAML document (loadable as a preset file)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
