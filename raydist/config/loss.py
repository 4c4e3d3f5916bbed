"""The config's ``loss`` section and the one loss-kind registry it is built from.

:data:`LOSS_KINDS` holds the registered loss kinds (``loss.kind`` values). It finds the shipped ones by package
name -- data, like a plugin's entry point: the first read imports every module of ``raydist.losses.kinds``
(torch-free declarations), where each kind registers itself; a plugin registers the same way. The section a
config holds (:func:`loss_section`) is the keys every kind shares (:class:`LossSectionBase`) plus each registered
kind's ``Options`` fields as flat ``loss.<option>`` keys, rebuilt whenever a kind joins or leaves.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field, create_model, field_validator
from pydantic.fields import FieldInfo

from raydist.config.base import Section, known
from raydist.registry import Registry, RegistryError

KINDS_PACKAGE = "raydist.losses.kinds"  # where the shipped loss kinds live, one module each


class LossSectionBase(Section):
    """The loss section's keys every loss kind shares. The section a config holds (:func:`loss_section`) adds the
    options of every registered loss kind: ``loss.<option>`` keys."""

    # "auto" = the task's default (ranking for pairs, cross_entropy for labels), or a registered loss kind
    kind: str = "auto"
    nesting_weights: list[float] = Field(default_factory=list)  # c_m per model.nesting dim; [] = all 1

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        """A registered loss kind (or auto); else the close names."""
        return known("loss kind", value, ["auto", *loss_kinds()])


def _same_field(a: FieldInfo, b: FieldInfo) -> bool:
    """Two declarations of one option agree: type, default and bounds."""
    return (a.annotation, a.metadata, a.get_default(call_default_factory=True)) == (
        b.annotation,
        b.metadata,
        b.get_default(call_default_factory=True),
    )


def _check_kind(name: str, kind: Any) -> None:
    """A loss kind declaration: its name, a task, pydantic ``Options`` whose fields may join the loss section
    (not a shared key; an option another kind has too only with the same type, default and bounds)."""
    if getattr(kind, "name", name) != name:
        raise RegistryError(f"loss {name!r}: the class says name = {kind.name!r}")
    if name == "auto":
        raise RegistryError(f"loss kind {name!r} is reserved (the task's default); pick another name")
    if not isinstance(getattr(kind, "task", None), str):
        raise RegistryError(f"loss {name!r}: set task = 'pairs' or 'labels' (the task it trains)")
    options = getattr(kind, "Options", None)
    if not (isinstance(options, type) and issubclass(options, BaseModel)):
        raise RegistryError(f"loss {name!r}: Options must be a pydantic model")
    for option, info in options.model_fields.items():
        if option in LossSectionBase.model_fields:
            raise RegistryError(
                f"loss kind {name!r}: option {option!r} is a key every loss shares; rename it"
            )
        for other in option_kinds(option):
            if not _same_field(info, LOSS_KINDS.get(other).Options.model_fields[option]):
                raise RegistryError(
                    f"loss kind {name!r}: option loss.{option} differs from loss kind {other!r}'s loss.{option} "
                    "(a shared option needs the same type, default and bounds); rename it"
                )
    kind.name = name


class LossKindRegistry(Registry[Any]):
    """The loss kinds by name; the loss section is rebuilt when one is registered or unregistered."""

    def __init__(self) -> None:
        super().__init__("loss", check=_check_kind, package=KINDS_PACKAGE)
        self._listeners: list[Callable[[type[LossSectionBase]], None]] = []
        self.section: type[LossSectionBase] = LossSectionBase

    def register(self, name: str, obj: Any = None, *, module: str | None = None) -> Any:
        """Add a loss kind (or ``@LOSS_KINDS.register(name)``); its options join the loss section."""
        if obj is None:
            return lambda kind: self.register(name, kind, module=module)
        super().register(name, obj, module=module)
        self._rebuild()
        return obj

    def unregister(self, name: str) -> None:
        """Remove ``name`` and its options unless another kind reads them (tests; a plugin's experiment)."""
        super().unregister(name)
        self._rebuild()

    def in_order(self) -> list[str]:
        """The registered kinds in registration order (the shipped ones first)."""
        self.discover()
        return list(self._entries)

    def on_change(self, listener: Callable[[type[LossSectionBase]], None]) -> None:
        """Call ``listener`` with the loss section now and whenever it is rebuilt."""
        self._listeners.append(listener)
        listener(self.section)

    def _rebuild(self) -> None:
        """The section = the shared keys + every registered kind's options (first declaration of each, in
        registration order)."""
        fields: dict[str, Any] = {}
        for name in list(self._entries):
            for option, info in self._entries[name].obj.Options.model_fields.items():
                fields.setdefault(option, (info.annotation, copy.copy(info)))
        self.section = create_model(
            "LossSection",
            __base__=LossSectionBase,
            __module__=__name__,
            __doc__=LossSectionBase.__doc__,
            **fields,
        )
        for listener in self._listeners:
            listener(self.section)


LOSS_KINDS = LossKindRegistry()


def loss_kinds() -> list[str]:
    """The registered loss kinds, in registration order (``auto`` not included)."""
    return LOSS_KINDS.in_order()


def loss_section() -> type[LossSectionBase]:
    """The loss section a config holds now: the shared keys and every registered kind's options."""
    LOSS_KINDS.discover()
    return LOSS_KINDS.section


def __getattr__(name: str) -> Any:
    """``LossSection``: the section as it is now (:func:`loss_section`), under the name its class has, so that
    a config pickles (a Ray process unpickling one finds the class here)."""
    if name == "LossSection":
        return loss_section()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def option_kinds(option: str) -> list[str]:
    """The registered loss kinds that read ``loss.<option>`` (in registration order)."""
    return [kind for kind in loss_kinds() if option in LOSS_KINDS.get(kind).Options.model_fields]
