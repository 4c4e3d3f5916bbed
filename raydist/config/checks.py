"""The cross-field checks of a run config (:func:`validate`: combinations of fields that are each valid alone,
refused before any Ray work starts) and the worker-count maths they and the trainer share."""

from __future__ import annotations

import math

from raydist.config.base import ConfigError
from raydist.config.loss import LOSS_KINDS
from raydist.config.schema import Config, TrainSection
from raydist.nesting import check_embedding_dim, check_nesting, check_weights


def loss_problems(cfg: Config, kind: str | None = None) -> list[str]:
    """The checks of loss kind ``kind`` (default ``loss.kind``) on ``cfg``: its ``LossKind.problems``, one line
    each. ``auto`` (the task's default kind, which a config alone does not know): every registered kind's
    checks, each of which looks only at its own options (a line several kinds give, once)."""
    kind = cfg.loss.kind if kind is None else kind
    kinds = LOSS_KINDS.in_order() if kind == "auto" else [kind]
    return list(dict.fromkeys(line for name in kinds for line in LOSS_KINDS.get(name).problems(cfg)))


def validate(cfg: Config) -> None:
    """Refuse combinations of fields that are each valid alone, before any Ray work starts."""
    problems = []
    t = cfg.train
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
    problems += loss_problems(cfg)
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
