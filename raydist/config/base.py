"""The config's error and base model: :class:`ConfigError`, the strict section model every section extends, and
the one-line messages that name a dotted key (a pydantic error, an unknown name with the close ones)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """A configuration that cannot be run: unknown key, wrong type or impossible combination."""


class Section(BaseModel):
    """A config section: unknown keys refused, assignments validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def known(what: str, value: str, names: Sequence[str]) -> str:
    """``value`` when it is one of ``names``; else a ValueError naming the close ones, else all of them."""
    if value in names:
        return value
    close = difflib.get_close_matches(value, names, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ValueError(f"unknown {what} {value!r}; {hint}known: {', '.join(names)}")


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


def dotted_key(loc: tuple[int | str, ...]) -> str:
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
        key = dotted_key(err["loc"])
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
