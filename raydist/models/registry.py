"""Named builders of one kind of encoder (image, text): plain names, and families (``"fam:"``) whose builder
takes the text after the colon (``"fam:<model>"``) as its first argument."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class BuilderRegistry:
    """The builders of one ``kind`` of encoder ("image encoder", "text encoder"), by name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._builders: dict[str, Callable[..., Any]] = {}

    def register(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A decorator registering its builder under ``name``; a name registered twice is an error."""

        def register(builder: Callable[..., Any]) -> Callable[..., Any]:
            if ":" in name[:-1] or not name.strip(":"):
                raise ValueError(f"{self.kind} name {name!r}: a plain name, or a family name ending in ':'")
            if name in self._builders:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._builders[name] = builder
            return builder

        return register

    def names(self) -> list[str]:
        """The registered names, sorted; a name ending in ``:`` takes a model name after it."""
        return sorted(self._builders)

    def resolve(self, name: str) -> tuple[Callable[..., Any], tuple[str, ...]]:
        """The builder of ``name`` and its leading arguments (a family's model name); unknown: ValueError."""
        family, sep, model = name.partition(":")
        key = f"{family}:" if sep else name
        if key not in self._builders or (sep and not model):
            known = ", ".join(n + "<model>" if n.endswith(":") else n for n in self.names())
            raise ValueError(f"unknown {self.kind} {name!r}; known: {known}")
        return self._builders[key], ((model,) if sep else ())
