"""Loss kinds and miners as registered components: what ``loss.kind`` and ``loss.miner`` name.

A loss kind is one :class:`LossKind` subclass registered with :func:`register_loss`: its ``name`` (the
``loss.kind`` value), the ``task`` it trains, its typed options (a pydantic model, ``Options``, whose fields are
the config keys ``loss.<option>``), what it needs (``gathers``, ``per_example``, learnable parameters from
:meth:`LossKind.module`) and :meth:`LossKind.loss`, this rank's loss from the task's gathered batch
(:class:`LossInputs`). The task wraps it in the one Matryoshka sum (:func:`raydist.losses.nested.nested_sum`)
and hands it each prefix view in turn. Registering a kind adds its options to the run config
(:func:`raydist.config.add_loss_options`). docs/losses.md ("Adding a loss") has a complete example file.

A miner (``loss.miner``) is a :class:`Miner` registered with :func:`register_miner`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ValidationError
from torch import Tensor, nn

from raydist.config import (
    Config,
    ConfigError,
    NoOptions,
    add_loss_options,
    add_miner,
    describe_errors,
    loss_kinds,
    remove_loss_options,
    remove_miner,
)
from raydist.distributed import GatheredBatch, NegativeSet, all_gather_tensor, step_generator
from raydist.losses.nested import Prefix, nested_sum
from raydist.losses.reducers import scale_for_world
from raydist.losses.triplets import Triplets
from raydist.registry import Registry, RegistryError

NO_NESTING = Prefix(None)  # the view of a run without model.nesting: the whole embedding


@dataclass(frozen=True)
class LossInputs:
    """What a loss kind computes this rank's loss from, for one Matryoshka prefix view.

    ``batch``: the step's gathered batch (:class:`raydist.distributed.GatheredBatch`): ``batch.local`` this
    rank's rows, ``batch.keys`` the global batch of all workers (rank-major; embeddings with autograd, ids
    without; just the local rows when the kind does not gather or ``loss.gather=false``), ``batch.positions``
    / ``batch.key_positions`` their global row numbers. Embeddings are this view's prefix, re-normalised.
    Task pairs: ``img``, ``cap`` embeddings, ``image_id``, ``sample_id`` ids; task labels: ``emb``, ``label``,
    ``sample_id``. ``negative_set``: the step's query rows and key subset (``loss.negative_set_size``).
    ``extras``: the encoder's other outputs for this view (labels: ``logits`` of the head) and the kind's
    learnable parameters (:meth:`LossKind.extras`). ``stats``: where to put per-step statistics (None on all
    but the largest prefix). ``view``: the prefix (:class:`raydist.losses.nested.Prefix`).
    """

    batch: GatheredBatch
    negative_set: NegativeSet
    extras: Mapping[str, Any]
    epoch: int
    global_step: int
    stats: dict[str, float] | None
    view: Prefix = NO_NESTING


class LossKind:
    """A loss kind (``loss.kind=<name>``). Subclass, set the class attributes, implement :meth:`loss` and
    register the class with :func:`register_loss`; the run builds one instance per process from the config
    (``self.cfg``, ``self.options``: the typed ``Options`` read from ``loss.<option>`` keys).

    The loss returned by :meth:`loss` is this rank's share: DDP averages the gradients over the W ranks, so a
    global mean over rows is ``W · (this rank's sum) / (global count)`` (:func:`world_mean`)."""

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

    @classmethod
    def read_options(cls, cfg: Config) -> BaseModel:
        """``Options`` from the config's ``loss.<option>`` values (the model's own validators run too)."""
        values = {name: getattr(cfg.loss, name) for name in cls.Options.model_fields}
        try:
            return cls.Options.model_validate(values)
        except ValidationError as e:
            raise ConfigError("\n".join(describe_errors(e, "loss.{key}"))) from e

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

    def state_dict(self) -> dict[str, Any]:
        """What the loss carries across restarts (saved in checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    def generator(self, inputs: LossInputs) -> torch.Generator:
        """A generator for the step's random draws (a miner's), seeded the same on every rank."""
        return step_generator(self.cfg.train.seed, inputs.global_step, 1)


class _LossRegistry(Registry[type[LossKind]]):
    def unregister(self, name: str) -> None:
        """Remove ``name`` and its config options (tests; a plugin's experiment)."""
        super().unregister(name)
        remove_loss_options(name)


def _check_loss(name: str, cls: type[LossKind]) -> None:
    """A loss kind class: a LossKind with this name, a task, pydantic options; its options join the config."""
    if not (isinstance(cls, type) and issubclass(cls, LossKind)):
        raise RegistryError(f"loss {name!r}: expected a LossKind subclass, got {cls!r}")
    if getattr(cls, "name", name) != name:
        raise RegistryError(f"loss {name!r}: the class says name = {cls.name!r}")
    if not isinstance(getattr(cls, "task", None), str):
        raise RegistryError(f"loss {name!r}: set task = 'pairs' or 'labels' (the task it trains)")
    if not (isinstance(cls.Options, type) and issubclass(cls.Options, BaseModel)):
        raise RegistryError(f"loss {name!r}: Options must be a pydantic model")
    cls.name = name
    try:
        add_loss_options(name, cls.Options)
    except ConfigError as e:
        raise RegistryError(str(e)) from e


LOSSES: Registry[type[LossKind]] = _LossRegistry("loss", check=_check_loss)


def register_loss(cls: type[LossKind]) -> type[LossKind]:
    """Class decorator: register the loss kind ``cls`` as ``loss.kind=cls.name`` (its options become
    ``loss.<option>`` config keys)."""
    return LOSSES.register(cls.name, cls)


def get_loss(name: str) -> type[LossKind]:
    """The loss kind class registered as ``name`` (unknown: the close names)."""
    return LOSSES.get(name)


def task_losses(task: str, default: str | None) -> tuple[str, ...]:
    """The loss kinds that train ``task``: its ``default`` first, then the others in registration order."""
    names = [kind for kind in loss_kinds() if kind in LOSSES and LOSSES.get(kind).task == task]
    return tuple(dict.fromkeys([default, *names] if default else names))


def world_mean(total: Tensor, count: Tensor | float, batch: GatheredBatch) -> Tensor:
    """This rank's share of a global mean: ``W · total_r / Σ_r count_r`` (one all-gather of the counts; none for
    a one-rank batch). ``total`` sums this rank's terms, ``count`` counts them; with every rank returning this,
    DDP's average of the gradients is the gradient of ``Σ_r total_r / Σ_r count_r`` and the mean of the
    returned values is that loss. Nothing counted anywhere: a graph-connected 0."""
    count = torch.as_tensor(count, device=total.device).reshape(1)
    if batch.world > 1:
        count = all_gather_tensor(count)
    return scale_for_world(total / count.sum().clamp(min=1), batch.world)


def nested_rank_loss(
    loss: Callable[[LossInputs], Tensor],
    inputs: LossInputs,
    embeddings: Sequence[str],
    dims: Sequence[int] | None,
    weights: Sequence[float] | None = None,
) -> Tensor:
    """The Matryoshka loss ``Σ_m c_m · loss(inputs at prefix m)`` (:func:`nested_sum`; ``model.nesting``,
    ``loss.nesting_weights``): the ``embeddings`` of the gathered batch as the prefix view (one gather serves
    every prefix), per-dim list extras (a nested head's logits) at the prefix's entry, statistics only from
    the largest prefix. Without nesting, ``loss(inputs)``."""

    def at(view: Prefix) -> Tensor:
        extras = {k: view.pick(v) if isinstance(v, list) else v for k, v in inputs.extras.items()}
        stats = inputs.stats if view.largest else None
        return loss(
            replace(inputs, batch=inputs.batch.view(view, embeddings), extras=extras, stats=stats, view=view)
        )

    return nested_sum(at, dims, weights)


@dataclass(frozen=True)
class Miner:
    """A triplet miner (``loss.miner``): ``mine(emb, labels, *, margin, distance, generator)`` returns the
    global :class:`Triplets` of unit rows (no autograd); ``random``: it draws from ``generator`` (seeded the
    same on every rank); ``probabilities`` (optional, same arguments plus the triplets' index tensors):
    ``P(n | a, p)`` of the drawn negatives, for the sampler-skew statistic."""

    mine: Callable[..., Triplets]
    random: bool = False
    probabilities: Callable[..., Tensor] | None = None

    def __post_init__(self) -> None:  # the registry names the module of the mining function
        object.__setattr__(
            self, "__module__", getattr(getattr(self.mine, "func", self.mine), "__module__", "?")
        )


class _MinerRegistry(Registry[Miner]):
    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests)."""
        super().unregister(name)
        remove_miner(name)


def _check_miner(name: str, miner: Miner) -> None:
    if not isinstance(miner, Miner):
        raise RegistryError(f"miner {name!r}: expected a raydist.losses.Miner, got {miner!r}")
    add_miner(name)


MINERS: Registry[Miner] = _MinerRegistry("miner", check=_check_miner)


def register_miner(name: str, miner: Miner) -> Miner:
    """Register ``miner`` as ``loss.miner=name``."""
    return MINERS.register(name, miner)
