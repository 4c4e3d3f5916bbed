"""raydist.losses: similarities and ranking losses (DESIGN.md §4)."""

from raydist.losses.ranking import (
    REDUCTIONS,
    RankingTerms,
    hinge_costs,
    ranking_loss,
    ranking_terms,
    reduce_negatives,
    reduce_queries,
)
from raydist.losses.similarity import (
    SIMILARITIES,
    l2_normalize,
    paired_similarity,
    pairwise_similarity,
)

__all__ = [
    "REDUCTIONS",
    "SIMILARITIES",
    "RankingTerms",
    "hinge_costs",
    "l2_normalize",
    "paired_similarity",
    "pairwise_similarity",
    "ranking_loss",
    "ranking_terms",
    "reduce_negatives",
    "reduce_queries",
]
