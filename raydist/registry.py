"""One registry mechanism for every kind of named component a user may add: tasks, image and text encoders,
losses, miners, converters, hooks and benchmarks. A :class:`Registry` maps names to objects (classes,
builders, descriptors); ``@REG.register("name")`` adds one. A name ending in ``:`` is a *family*: its object
takes the text after the colon (``timm:resnet18`` → ``resnet18``) as its first argument.

Every registry is listed in :func:`registries` by its kind (what ``raydist plugins`` prints). The shipped
components register when their modules are imported: a registry made with ``package=`` imports every module of
that package (names not starting with ``_``) the first time it is asked for a name (:meth:`Registry.discover`),
so a new shipped component is one module dropped into its package. A plugin (:mod:`raydist.plugins`) registers
the same way, from anywhere.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import pkgutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")

_REGISTRIES: dict[str, Registry[Any]] = {}


class RegistryError(ValueError):
    """An unknown name, or a name registered twice by different code."""


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered object, with the module that registered it."""

    name: str
    obj: T
    module: str


class Registry(Generic[T]):
    """The objects of one ``kind`` ("image encoder", "loss", ...) by name. ``families``: names ending in ``:``
    take an argument after the colon. ``check``: called with (name, obj) before an object is added (raise to
    refuse it). ``package``: the dotted name of the package whose modules register the shipped objects; they
    are imported the first time the registry is read (:meth:`discover`)."""

    def __init__(
        self,
        kind: str,
        *,
        families: bool = False,
        check: Callable[[str, T], None] | None = None,
        package: str | None = None,
    ) -> None:
        if kind in _REGISTRIES:
            raise RegistryError(f"a registry of kind {kind!r} exists already")
        self.kind, self.families, self._check = kind, families, check
        self.package, self._discovered = package, package is None
        self._entries: dict[str, Entry[T]] = {}
        _REGISTRIES[kind] = self

    def discover(self) -> list[str]:
        """Import every module of :attr:`package` whose name does not start with ``_`` (each registers its
        objects), once per process; return the registered names. A module that fails to import is a
        :class:`RegistryError` naming it and the error."""
        if not self._discovered:
            self._discovered = True  # set first: a module being imported may read the registry
            spec = importlib.util.find_spec(self.package)
            imported = sys.modules.get(self.package)  # an imported package's __path__ (it may be extended)
            paths = (
                getattr(imported, "__path__", None) if imported else spec and spec.submodule_search_locations
            )
            if spec is None or paths is None:
                raise RegistryError(f"{self.kind} registry: {self.package!r} is not a package")
            for module in sorted(pkgutil.iter_modules(paths), key=lambda m: m.name):
                if module.name.startswith("_"):
                    continue
                name = f"{self.package}.{module.name}"
                try:
                    importlib.import_module(name)
                except ImportError as e:
                    self._discovered = False
                    raise RegistryError(f"{self.kind} module {name} cannot be imported: {e}") from e
        return sorted(self._entries)

    @overload
    def register(self, name: str, *, module: str | None = None) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, obj: T, *, module: str | None = None) -> T: ...

    def register(self, name: str, obj: Any = None, *, module: str | None = None) -> Any:
        """Add ``obj`` under ``name`` (returns it), or as a decorator ``@registry.register(name)``. ``module``:
        the module that registers it, as listed (default: the object's ``__module__``; pass it for an
        instance of a shipped class made by a plugin). A name registered already is an error naming the module
        that has it."""

        def add(obj: T) -> T:
            self._validate_name(name)
            old = self._entries.get(name)
            if old is not None:
                raise RegistryError(
                    f"{self.kind} {name!r} is already registered by {old.module}; "
                    f"{module or getattr(obj, '__module__', '?')} cannot register it again (pick another name)"
                )
            if self._check is not None:
                self._check(name, obj)
            self._entries[name] = Entry(name, obj, module or getattr(obj, "__module__", None) or "?")
            return obj

        return add if obj is None else add(obj)

    def _validate_name(self, name: str) -> None:
        if not isinstance(name, str) or not name.strip(":") or name != name.strip():
            raise RegistryError(f"{self.kind} name {name!r}: expected a non-empty name")
        if ":" in name[:-1] or (name.endswith(":") and not self.families):
            allowed = "a plain name, or a family name ending in ':'" if self.families else "a plain name"
            raise RegistryError(f"{self.kind} name {name!r}: {allowed}")

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests; a plugin's experiment)."""
        self._entries.pop(name, None)

    def names(self) -> list[str]:
        """The registered names, sorted (a family's ends in ``:``)."""
        return self.discover()

    def shown_names(self) -> list[str]:
        """The names as a user writes them (``timm:<model>`` for a family)."""
        return [n + "<model>" if n.endswith(":") else n for n in self.names()]

    def entries(self) -> Iterator[Entry[T]]:
        """Every entry, sorted by name."""
        self.discover()
        return iter(self._entries[n] for n in self.names())

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        self.discover()
        family, sep, arg = name.partition(":")
        return (f"{family}:" in self._entries and bool(arg)) if sep else name in self._entries

    def __len__(self) -> int:
        self.discover()
        return len(self._entries)

    def unknown(self, name: str) -> RegistryError:
        """The error for a name that is not registered: the close names, else all of them."""
        known = self.shown_names()
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        return RegistryError(f"unknown {self.kind} {name!r}; {hint}known: {', '.join(known) or '(none)'}")

    def get(self, name: str) -> T:
        """The object registered as ``name`` (a plain name); unknown: :class:`RegistryError`."""
        self.discover()
        if name not in self._entries or name.endswith(":"):
            raise self.unknown(name)
        return self._entries[name].obj

    def resolve(self, name: str) -> tuple[T, tuple[str, ...]]:
        """The object of ``name`` and its leading arguments: ``()`` for a plain name, ``(model,)`` for
        ``family:model``; unknown: :class:`RegistryError`."""
        self.discover()
        family, sep, arg = name.partition(":")
        key = f"{family}:" if sep else name
        if key not in self._entries or (sep and not arg):
            raise self.unknown(name)
        return self._entries[key].obj, ((arg,) if sep else ())

    def module_of(self, name: str) -> str:
        """The module that registered ``name``."""
        self.discover()
        return self._entries[name].module


def registries() -> dict[str, Registry[Any]]:
    """Every registry by kind, in the order they were created."""
    return dict(_REGISTRIES)


def registry(kind: str) -> Registry[Any]:
    """The registry of ``kind``; unknown kind: :class:`RegistryError` listing the kinds."""
    if kind not in _REGISTRIES:
        raise RegistryError(f"no registry of kind {kind!r}; kinds: {', '.join(_REGISTRIES)}")
    return _REGISTRIES[kind]
