"""The names of the losses' choices (miner strategies, distances, similarities, reductions): plain strings,
the one list each that the losses check against and the run config's ``Literal`` fields are built from.

In the foundation layer (imports nothing), so the config and the losses both read it.
"""

MINER_STRATEGIES = (
    "all",
    "semihard-all",
    "semihard-fixed",
    "semihard-random",
    "hardest",
    "one-to-one",
    "distance-weighted",
)
DISTANCES = ("euclidean", "cosine")
SIMILARITIES = ("dot", "order")
REDUCTIONS = ("sum", "mean")
