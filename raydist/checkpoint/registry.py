"""The state registry: components with state (model, optimizer, scheduler, scaler, a hook's statistics)
register under a name, and checkpoints save and restore every registered component without the loop
knowing them."""

from __future__ import annotations

from typing import Any, Protocol


class Stateful(Protocol):
    """Anything with ``state_dict()`` / ``load_state_dict(state)``."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


class StateRegistry:
    """Named stateful components; :meth:`state_dict` is what a checkpoint's state holds for them."""

    def __init__(self) -> None:
        self._items: dict[str, Stateful] = {}

    def register(self, name: str, component: Stateful) -> None:
        """Add ``component`` under ``name`` (names are unique)."""
        if name in self._items:
            raise ValueError(f"a component named {name!r} is already registered")
        self._items[name] = component

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._items)

    def state_dict(self) -> dict[str, Any]:
        """``{name: component.state_dict()}``."""
        return {name: item.state_dict() for name, item in self._items.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore every registered component; a component missing from ``state`` is an error."""
        missing = [name for name in self._items if name not in state]
        if missing:
            raise ValueError(f"checkpoint has no state for {', '.join(missing)}")
        for name, item in self._items.items():
            item.load_state_dict(state[name])
