"""Loss kinds and miners as registered declarations: what ``loss.kind`` and ``loss.miner`` name. Torch-free, so a
config loads without torch; a kind imports its torch maths where it computes (:meth:`LossKind.loss`).

A loss kind is one :class:`LossKind` subclass registered with :func:`register_loss`: its ``name`` (the
``loss.kind`` value), the ``task`` it trains, its typed options (a pydantic model, ``Options``, whose fields are
the config keys ``loss.<option>``), what it needs (``gathers``, ``per_example``, learnable parameters from
:meth:`LossKind.module`), its schedule and checks (:meth:`LossKind.schedule`, :meth:`LossKind.negative_set_size`,
:meth:`LossKind.problems`) and :meth:`LossKind.loss`, this rank's loss from the task's gathered batch
(:class:`raydist.losses.inputs.LossInputs`). The task wraps it in the one Matryoshka sum
(:func:`raydist.losses.nested.nested_sum`) and hands it each prefix view in turn. The registry is the config's
(:data:`raydist.config.LOSS_KINDS`): registering a kind adds its options to the run config.
docs/metric-learning.md ("Adding a loss") has a complete example file.

The miners (``loss.miner``) are :mod:`raydist.losses.miners`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from raydist.config.base import ConfigError, describe_errors
from raydist.config.loss import LOSS_KINDS, loss_kinds
from raydist.registry import RegistryError

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from raydist.config import Config
    from raydist.losses.inputs import LossInputs
    from raydist.losses.memory import EmbeddingMemory, MinedNegatives


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoOptions(_Options):
    """A loss kind without options of its own."""


class MinedOptions(_Options):
    """The options of a loss on negatives mined from the batch (ranking, triplet, margin)."""

    margin: float = Field(0.2, ge=0)  # ranking / triplet margin; the margin loss's alpha
    gather: bool = True  # mine negatives from the global batch of all workers


class MemoryOptions(_Options):
    """The loss memory's options (docs/algorithms.md#loss-memory), for the kinds that score its rows."""

    memory_size: int = Field(0, ge=0)  # rows of past global batches kept as extra negatives; 0 = off
    memory_warmup_steps: int = Field(0, ge=0)  # steps the queue only fills before its rows are scored


class MiningOptions(_Options):
    """Corpus-mined hard negatives (docs/algorithms.md#corpus-mined-negatives), for the kinds that score extra keys."""

    # K negatives mined from the train split per sample; 0 = off
    mined_negatives: int = Field(0, ge=0)
    # steps between two minings (each embeds the train split anew)
    mine_every: int = Field(100, ge=1)
    # [lo, hi]: the ranks (1 = the hardest) a mined negative may have among its query's candidates
    mine_range: list[int] = Field(default_factory=lambda: [1, 100])
    # a mined negative scores below the positive's score × (1 − mine_margin)
    mine_margin: float = Field(0.0, ge=0, lt=1)


class LossKind:
    """A loss kind (``loss.kind=<name>``). Subclass, set the class attributes, implement :meth:`loss` and
    register the class with :func:`register_loss`; the run builds one instance per process from the config
    (``self.cfg``, ``self.options``: the typed ``Options`` read from ``loss.<option>`` keys). The classmethods
    read a config without building the loss (the driver's schedule and checks).

    The loss returned by :meth:`loss` is this rank's share: DDP averages the gradients over the W ranks, so a
    global mean over rows is ``W · (this rank's sum) / (global count)`` (:func:`raydist.losses.world_mean`)."""

    name: ClassVar[str]  # the loss.kind value
    task: ClassVar[str]  # the task it trains: "pairs" or "labels" (or a registered task's name)
    Options: ClassVar[type[BaseModel]] = NoOptions  # pydantic model: the loss.<option> keys it reads
    gathers: ClassVar[bool] = (
        True  # needs the global batch of all workers (loss.gather may still turn it off)
    )
    per_example: ClassVar[bool] = False  # a mean of per-row terms (gradient clustering's exact setting)
    trains_head: ClassVar[bool] = False  # labels: the loss trains the class head (else the head is a probe)
    module_name: ClassVar[str] = "loss_module"  # the model attribute holding the learnable parameters

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.options = self.read_options(cfg)
        # the loss memory (loss.memory_size), and the rows mined from the train split (loss.mined_negatives, set
        # by the corpus-negatives hook), for the kinds that read them
        self.memory: EmbeddingMemory | None = None
        self.mined: MinedNegatives | None = None
        if size := self.memory_size(cfg):
            from raydist.losses.memory import EmbeddingMemory

            self.memory = EmbeddingMemory(size)

    @classmethod
    def read_options(cls, cfg: Config) -> Any:
        """``Options`` from the config's ``loss.<option>`` values (the model's own validators run too)."""
        values = {name: getattr(cfg.loss, name) for name in cls.Options.model_fields}
        try:
            return cls.Options.model_validate(values)
        except ValidationError as e:
            raise ConfigError("\n".join(describe_errors(e, "loss.{key}"))) from e

    @classmethod
    def schedule(cls, cfg: Config, steps_per_epoch: int) -> tuple[dict[str, Any], list[str]]:
        """What the run's schedule sets for this kind, given the steps of an epoch: dotted keys of the resolved
        run config (``{"loss.warmup_sh_epochs": 3}``) and fragments of the schedule line. Default: none."""
        return {}, []

    @classmethod
    def negative_set_size(cls, cfg: Config) -> int | None:
        """The keys each step's queries are scored against (None: the global batch, the default)."""
        return None

    @classmethod
    def memory_size(cls, cfg: Config) -> int:
        """``loss.memory_size`` when this kind reads it (its ``Options`` are :class:`MemoryOptions`), else 0."""
        return cfg.loss.memory_size if "memory_size" in cls.Options.model_fields else 0

    @classmethod
    def mined_negatives(cls, cfg: Config) -> int:
        """``loss.mined_negatives`` when this kind reads it (its ``Options`` are :class:`MiningOptions`), else 0."""
        return cfg.loss.mined_negatives if "mined_negatives" in cls.Options.model_fields else 0

    @classmethod
    def problems(cls, cfg: Config) -> list[str]:
        """This kind's checks of a run config, one line each naming the key (before any Ray work starts).
        Default: the loss memory's (it holds global batches, the same on every rank) and the mining range."""
        size, lines = cls.memory_size(cfg), []
        if cls.mined_negatives(cfg) and not (
            len(cfg.loss.mine_range) == 2 and 1 <= cfg.loss.mine_range[0] <= cfg.loss.mine_range[1]
        ):
            lines.append(f"loss.mine_range={cfg.loss.mine_range}: need [lo, hi] with 1 <= lo <= hi (ranks)")
        if size and not getattr(cfg.loss, "gather", True):
            lines.append(f"loss.memory_size={size} needs loss.gather=true: the queue holds global batches")
        if size and (cfg.gc.measure or cfg.gc.sample):
            lines.append(
                f"loss.memory_size={size} with gc.measure/gc.sample: gradient clustering scores a worker's rows "
                "on their own, without the queue (use one or the other)"
            )
        return lines

    def loss(self, inputs: LossInputs) -> Tensor:
        """This rank's loss on one prefix view (scaled so that DDP's average gives the global gradient)."""
        raise NotImplementedError

    def module(self, num_classes: int | None) -> nn.Module | None:
        """Learnable parameters of the loss (e.g. the margin loss's β), added to the model as
        :attr:`module_name` (DDP averages their gradients, the optimizer steps them); None: none."""
        return None

    def extras(self, model: nn.Module) -> dict[str, Tensor]:
        """The parameters of :meth:`module` as the step's extras (``LossInputs.extras``), by their names."""
        module = getattr(model, self.module_name, None)
        return dict(module.named_parameters()) if module is not None else {}

    def phase(self, epoch: int) -> str | None:
        """The loss phase of an epoch when the loss switches (shown in progress and history)."""
        return None

    def end_epoch(self, epoch: int, metrics: dict[str, Any]) -> list[str]:
        """React to an epoch's training metrics (the same on every rank); return notes for the user."""
        return []

    def epoch_metrics(self, epoch: int) -> dict[str, Any]:
        """Extra per-epoch facts for the history."""
        return {}

    def extra_keys(self, inputs: LossInputs) -> dict[str, Tensor] | None:
        """The extra keys of this step as this prefix view sees them (embeddings sliced and re-normalised as the
        batch's, ids as they are; no graph): the loss memory's rows (after ``loss.memory_warmup_steps``), then the
        corpus-mined negatives of the step's global batch (``loss.mined_negatives``); None: neither."""
        import torch

        parts = []
        if self.memory is not None and inputs.global_step >= self.options.memory_warmup_steps:
            parts.append(self.memory.rows(inputs.batch.positions.device))
        if self.mined is not None:
            step = inputs.step_batch if inputs.step_batch is not None else inputs.batch
            parts.append(self.mined.rows_of(step.keys["sample_id"]))
        parts = [p for p in parts if p is not None]
        if not parts:
            return None
        rows = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        return {k: inputs.view(v) if v.is_floating_point() else v for k, v in rows.items()}

    def remember(self, inputs: LossInputs) -> None:
        """After the step's largest prefix (the last term of the Matryoshka sum): push the step's global batch
        at full width into the loss memory, and report its fill (``memory/fill``, rows) in the step's stats."""
        if self.memory is None or not inputs.view.largest:
            return
        self.memory.push(inputs.step_batch.keys if inputs.step_batch is not None else inputs.batch.keys)
        if inputs.stats is not None:
            inputs.stats["memory/fill"] = float(self.memory.filled)

    def state_dict(self) -> dict[str, Any]:
        """What the loss carries across restarts (saved in checkpoints): the loss memory's queue."""
        return {"memory": self.memory.state_dict()} if self.memory is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        if self.memory is not None:
            self.memory.load_state_dict(state["memory"])

    def generator(self, inputs: LossInputs) -> torch.Generator:
        """A generator for the step's random draws (a miner's), seeded the same on every rank."""
        from raydist.distributed import step_generator

        return step_generator(self.cfg.train.seed, inputs.global_step, 1)


LOSSES = LOSS_KINDS  # the loss kinds by name: the config's one registry (raydist.config.loss)


def register_loss(cls: type[LossKind]) -> type[LossKind]:
    """Class decorator: register the loss kind ``cls`` as ``loss.kind=cls.name`` (its options become
    ``loss.<option>`` config keys)."""
    if not (isinstance(cls, type) and issubclass(cls, LossKind)):
        raise RegistryError(f"loss {getattr(cls, 'name', cls)!r}: expected a LossKind subclass, got {cls!r}")
    return LOSSES.register(cls.name, cls)


def get_loss(name: str) -> type[LossKind]:
    """The loss kind class registered as ``name`` (unknown: the close names)."""
    return LOSSES.get(name)


def task_losses(task: str, default: str | None) -> tuple[str, ...]:
    """The loss kinds that train ``task``: its ``default`` first, then the others in registration order."""
    names = [kind for kind in loss_kinds() if LOSSES.get(kind).task == task]
    return tuple(dict.fromkeys([default, *names] if default else names))
