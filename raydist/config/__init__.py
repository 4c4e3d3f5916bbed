"""Typed run configuration, one concern a module: the schema (:mod:`~raydist.config.schema`: sections and
:class:`Config`), the loss section and its one loss-kind registry (:mod:`~raydist.config.loss`), the cross-field
checks and worker-count maths (:mod:`~raydist.config.checks`), and the loaders -- presets, preset files, dotted
overrides, saved configs -- with their one plugin step (:mod:`~raydist.config.loading`). Every public name is
here: ``from raydist.config import load_config``.
"""

from typing import Any

from raydist.config.base import ConfigError, Section, describe_errors, known
from raydist.config.checks import (
    ELASTIC_RETRIES,
    epoch_steps,
    failure_retries,
    loss_problems,
    nearby_multiples,
    validate,
    worker_counts,
    worker_counts_multiple,
)
from raydist.config.loading import (
    DEFAULT_PRESET,
    DEFAULT_TASK,
    TASKS_KEY,
    apply_overrides,
    chosen_preset,
    from_dict,
    from_saved,
    import_plugins,
    load_config,
    parse_overrides,
    preset_names,
    read_preset_file,
    resolve_plugins,
    run_overrides,
    set_keys,
    shipped_loss_values,
)
from raydist.config.loss import (
    LOSS_KINDS,
    LossSectionBase,
    loss_kinds,
    loss_section,
    option_kinds,
)
from raydist.config.schema import (
    AMP_MODES,
    TOP_LEVEL_KEYS,
    Config,
    DataSection,
    DebugSection,
    EvalSection,
    GCSection,
    ModelSection,
    TrainSection,
    dump_yaml,
    field_annotation,
    flatten,
    is_finite_number,
    key_suggestion,
    valid_keys,
)

__all__ = [
    "AMP_MODES",
    "DEFAULT_PRESET",
    "DEFAULT_TASK",
    "ELASTIC_RETRIES",
    "LOSS_KINDS",
    "TASKS_KEY",
    "TOP_LEVEL_KEYS",
    "Config",
    "ConfigError",
    "DataSection",
    "DebugSection",
    "EvalSection",
    "GCSection",
    "LossSection",
    "LossSectionBase",
    "ModelSection",
    "Section",
    "TrainSection",
    "apply_overrides",
    "chosen_preset",
    "describe_errors",
    "dump_yaml",
    "epoch_steps",
    "failure_retries",
    "field_annotation",
    "flatten",
    "from_dict",
    "from_saved",
    "import_plugins",
    "is_finite_number",
    "key_suggestion",
    "known",
    "load_config",
    "loss_kinds",
    "loss_problems",
    "loss_section",
    "nearby_multiples",
    "option_kinds",
    "parse_overrides",
    "preset_names",
    "read_preset_file",
    "resolve_plugins",
    "run_overrides",
    "set_keys",
    "shipped_loss_values",
    "valid_keys",
    "validate",
    "worker_counts",
    "worker_counts_multiple",
]


def __getattr__(name: str) -> Any:
    """``LossSection``: the loss section as it is now (:func:`loss_section`; a plugin's kind may have joined)."""
    if name == "LossSection":
        return loss_section()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


LOSS_KINDS.discover()  # the shipped loss kinds' options join the loss section (last: they import this package)
