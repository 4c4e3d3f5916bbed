"""raydist: Ray-native distributed training of retrieval embeddings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from raydist.retrieval.embedder import Embedder

__all__ = ["Embedder", "__version__"]


def __getattr__(name: str) -> Any:
    """``raydist.Embedder`` on first use: importing :mod:`raydist.retrieval.embedder` loads torch (seconds), which
    ``import raydist`` and the command line's start must not pay."""
    if name == "Embedder":
        from raydist.retrieval.embedder import Embedder

        return Embedder
    raise AttributeError(f"module 'raydist' has no attribute {name!r}")
