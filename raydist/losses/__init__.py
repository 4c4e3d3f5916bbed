"""raydist.losses: distances and similarities (objects a loss takes), miners (index tuples), per-element terms,
reducers; ranking and metric losses; the loss kinds a run config names (``loss.kind``: :class:`LossKind`, the
cross-worker losses; :mod:`raydist.losses.kinds`). Miners, distances, similarities and reducers are small
classes registered by name (``loss.miner``, ``loss.distance``, ``loss.similarity``, ``loss.reduction``), one
module each in the packages :mod:`~raydist.losses.miners`, :mod:`~raydist.losses.distances`,
:mod:`~raydist.losses.similarity` and :mod:`~raydist.losses.reducers`.

The names below are imported from their modules at first use, so that importing a torch-free module of this
package (a loss kind's declaration, :mod:`raydist.losses.kinds`, which a config load reads) imports no torch."""

from __future__ import annotations

import importlib
from typing import Any

# each public name, by the module (below raydist.losses) that defines it
_EXPORTS: dict[str, tuple[str, ...]] = {
    "cross_worker_metric": (
        "cross_worker_metric_loss",
        "rank_metric_loss",
    ),
    "cross_worker_ranking": (
        "cross_worker_ranking_loss",
        "rank_ranking_loss",
        "step_ranking_loss",
    ),
    "distances": (
        "DISTANCES",
        "Distance",
    ),
    "inputs": (
        "LossInputs",
        "nested_rank_loss",
        "world_mean",
    ),
    "kinds": (
        "LOSSES",
        "LossKind",
        "get_loss",
        "register_loss",
    ),
    "margin": (
        "MarginBeta",
        "margin_loss",
        "margin_loss_parts",
    ),
    "miners": (
        "MINERS",
        "Miner",
        "TripletMiner",
        "get_miner",
        "register_miner",
    ),
    "miners.hardest_negatives": (
        "HardestNegatives",
        "mine_hardest_negatives",
    ),
    "nested": (
        "Prefix",
        "nested_loss",
        "nested_sum",
        "nested_views",
    ),
    "noise": (
        "noise_tolerance",
        "pair_flip_rates",
        "sampler_skew",
    ),
    "ranking": (
        "RankingTerms",
        "hinge_costs",
        "hinge_terms",
        "mh_collapse_value",
        "mined_ranking_terms",
        "ranking_loss",
        "ranking_terms",
        "reduce_negatives",
    ),
    "ranking_inputs": ("RankingInputs",),
    "reducers": (
        "REDUCERS",
        "Reducer",
        "reduce_queries",
        "scale_for_world",
    ),
    "similarity": (
        "SIMILARITIES",
        "Similarity",
        "l2_normalize",
        "paired_similarity",
        "pairwise_similarity",
    ),
    "tiled_sh": (
        "TiledSumOfHinges",
        "sum_of_hinges",
    ),
    "tiles": (
        "ScoreTile",
        "TILE_ELEMENTS",
        "score_tiles",
        "tile_shape",
    ),
    "triplets": (
        "Triplets",
        "mine_triplets",
        "triplet_loss",
        "triplet_terms",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    """``raydist.losses.<name>``: imported from its module at the first use, then kept here."""
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
