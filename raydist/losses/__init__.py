"""raydist.losses: similarities, miners (index tuples), per-element terms, reducers; ranking and metric losses.
The choices' names (miner strategies, distances, similarities, reductions) are :mod:`raydist.choices`."""

from raydist.losses.margin import MarginBeta, margin_loss, margin_loss_parts
from raydist.losses.miners import (
    TILE_ELEMENTS,
    HardestNegatives,
    RankingInputs,
    ScoreTile,
    mine_hardest_negatives,
    score_tiles,
    tile_shape,
)
from raydist.losses.nested import nested_loss, nested_views
from raydist.losses.noise import noise_tolerance, pair_flip_rates, sampler_skew
from raydist.losses.ranking import (
    RankingTerms,
    hinge_costs,
    hinge_terms,
    mh_collapse_value,
    mined_ranking_terms,
    ranking_loss,
    ranking_terms,
    reduce_negatives,
)
from raydist.losses.reducers import reduce_queries, scale_for_world
from raydist.losses.similarity import l2_normalize, paired_similarity, pairwise_similarity
from raydist.losses.tiled_sh import TiledSumOfHinges, sum_of_hinges
from raydist.losses.triplets import Triplets, mine_triplets, triplet_loss, triplet_terms

__all__ = [
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
