"""The names of the losses' choices (miner strategies, distances, similarities, reductions): plain strings,
the one list each that the losses check against and the run config's ``Literal`` fields are built from.

Torch-free, so that :mod:`raydist.config` can import it without importing torch.
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
