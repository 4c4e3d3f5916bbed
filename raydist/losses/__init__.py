"""raydist.losses: similarities, miners (index tuples), per-element terms, reducers; ranking and metric losses.

The names below are imported from their submodules on first use (PEP 562 ``__getattr__``), so importing
:mod:`raydist.losses.names` (plain strings, read by the run config) does not import torch.
"""

from importlib import import_module
from typing import Any

__all__ = [
    "DISTANCES",
    "MINER_STRATEGIES",
    "REDUCTIONS",
    "SIMILARITIES",
    "TILE_ELEMENTS",
    "HardestNegatives",
    "MarginBeta",
    "RankingInputs",
    "RankingTerms",
    "ScoreTile",
    "TiledSumOfHinges",
    "Triplets",
    "hinge_costs",
    "hinge_terms",
    "l2_normalize",
    "margin_loss",
    "margin_loss_parts",
    "mh_collapse_value",
    "mine_hardest_negatives",
    "mine_triplets",
    "mined_ranking_terms",
    "nested_loss",
    "nested_views",
    "noise_tolerance",
    "pair_flip_rates",
    "paired_similarity",
    "pairwise_similarity",
    "ranking_loss",
    "ranking_terms",
    "reduce_negatives",
    "reduce_queries",
    "sampler_skew",
    "scale_for_world",
    "score_tiles",
    "sum_of_hinges",
    "tile_shape",
    "triplet_loss",
    "triplet_terms",
]
_SUBMODULES = (
    "names", "similarity", "distances", "reducers", "miners", "tiled_sh", "ranking", "triplets", "margin",
    "nested", "noise",
)  # fmt: skip


def __getattr__(name: str) -> Any:
    """The exported ``name``, from the first submodule that defines it (then cached in this module)."""
    if name in __all__:
        for submodule in _SUBMODULES:
            namespace = vars(import_module(f"{__name__}.{submodule}"))
            if name in namespace:
                globals()[name] = namespace[name]
                return namespace[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
