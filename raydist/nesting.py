"""Matryoshka nesting lists: the checks that the run config, the nested losses and the nested heads share
(foundation layer: plain Python, no torch)."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence


def check_nesting(dims: Sequence[int], *, any_order: bool = False) -> tuple[int, ...]:
    """The nesting list as a tuple of distinct positive ints in increasing order; non-empty.

    ``any_order`` sorts the list instead of refusing one out of order (duplicates are refused either way).
    """
    if isinstance(dims, (str, bytes)) or len(dims) == 0:
        raise ValueError(f"dims={dims!r}: expected a non-empty sequence of positive ints")
    if any(isinstance(m, bool) for m in dims):
        raise ValueError(f"dims={dims!r}: expected ints, got a bool")
    out = tuple(operator.index(m) for m in dims)
    if min(out) < 1:
        raise ValueError(f"dims={out}: nesting dims must be positive, got {min(out)}")
    if len(set(out)) < len(out):
        raise ValueError(
            f"dims={out}: nesting dims must be distinct, got {max(out, key=out.count)} twice or more"
        )
    if any_order:
        return tuple(sorted(out))
    if list(out) != sorted(out):
        raise ValueError(f"dims={out}: expected increasing nesting dims")
    return out


def check_embedding_dim(dims: Sequence[int], embed_dim: int) -> None:
    """The largest prefix must fit in the embedding: ``max(dims) <= embed_dim``."""
    if dims[-1] > embed_dim:
        raise ValueError(f"nesting dim {dims[-1]} exceeds the embedding dim {embed_dim} (dims={tuple(dims)})")


def check_weights(weights: Sequence[float] | None, count: int) -> tuple[float, ...]:
    """Per-prefix weights ``c_m``: ``count`` finite non-negative numbers; ``None`` means all 1."""
    out = (1.0,) * count if weights is None else tuple(float(c) for c in weights)
    if len(out) != count:
        raise ValueError(f"{len(out)} weights for {count} nesting dims")
    if any(not math.isfinite(c) or c < 0 for c in out):
        raise ValueError(f"weights={out}: expected finite non-negative numbers")
    return out
