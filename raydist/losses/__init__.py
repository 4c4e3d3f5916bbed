"""raydist.losses: similarities, miners (index tuples), per-element terms, reducers; ranking losses."""

from raydist.losses.miners import (
    TILE_ELEMENTS,
    HardestNegatives,
    ScoreTile,
    mine_hardest_negatives,
    score_tiles,
    tile_shape,
)
from raydist.losses.ranking import (
    RankingTerms,
    hinge_costs,
    hinge_terms,
    mined_ranking_terms,
    ranking_loss,
    ranking_terms,
    reduce_negatives,
)
from raydist.losses.reducers import REDUCTIONS, reduce_queries, scale_for_world
from raydist.losses.similarity import (
    SIMILARITIES,
    l2_normalize,
    paired_similarity,
    pairwise_similarity,
)
from raydist.losses.tiled_sh import TiledSumOfHinges, sum_of_hinges

__all__ = [
    "REDUCTIONS",
    "SIMILARITIES",
    "TILE_ELEMENTS",
    "HardestNegatives",
    "RankingTerms",
    "ScoreTile",
    "TiledSumOfHinges",
    "hinge_costs",
    "hinge_terms",
    "l2_normalize",
    "mine_hardest_negatives",
    "mined_ranking_terms",
    "paired_similarity",
    "pairwise_similarity",
    "ranking_loss",
    "ranking_terms",
    "reduce_negatives",
    "reduce_queries",
    "scale_for_world",
    "score_tiles",
    "sum_of_hinges",
    "tile_shape",
]
