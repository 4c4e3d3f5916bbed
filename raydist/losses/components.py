"""What the losses' named components (miners, distances, similarities, reducers) share: a base class whose
subclasses register by name in a registry of their kind, the one way a name or an object becomes an instance, and
the one refusal of a config value that names no registered component. Torch-free."""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from raydist.config.base import ConfigError
from raydist.registry import Registry, RegistryError


class Component:
    """A named component of the losses; :attr:`name` is set when its class is registered."""

    name: ClassVar[str]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


C = TypeVar("C", bound=Component)


def component_registry(kind: str, base: type[C], package: str) -> Registry[type[C]]:
    """The registry of ``kind`` (``loss.<kind>`` values): subclasses of ``base`` found in the modules of
    ``package`` (:meth:`raydist.registry.Registry.discover`); registering one sets its :attr:`~Component.name`."""

    def check(name: str, cls: type[C]) -> None:
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise RegistryError(f"{kind} {name!r}: expected a {base.__name__} subclass, got {cls!r}")
        cls.name = name

    return Registry(kind, check=check, package=package)


def build(registry: Registry[type[C]], value: str | C) -> C:
    """``value`` when it is a component already, else the registered class of that name built without options
    (unknown: a ValueError naming the close ones)."""
    return registry.get(value)() if isinstance(value, str) else value


def registered(registry: Registry[Any], key: str, name: str) -> Any:
    """The object registered as ``name`` for the config key ``key`` (``loss.miner``); unknown: a
    :class:`~raydist.config.ConfigError` naming the key and the close names
    (``loss.miner: unknown miner 'semihard-randm'; did you mean semihard-random? known: ...``)."""
    try:
        return registry.get(name)
    except RegistryError as e:
        raise ConfigError(f"{key}: {e}") from e
