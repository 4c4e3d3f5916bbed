"""raydist.gradclust: gradient clustering (Faghri et al. 2020) — layer statistics, A/U steps, sharded
reduce, stratified sampler with unbiased weights, variance meter (docs/algorithms.md#gradient-clustering)."""

from raydist.gradclust.centres import RankOneCentres, assign, layer_terms, squared_distances
from raydist.gradclust.clustering import GradientClustering
from raydist.gradclust.layers import (
    DenseFactors,
    EmbeddingFactors,
    Factors,
    LayerCapture,
    gram_is_cheaper,
    scan_layers,
    unsupported_layers,
)
from raydist.gradclust.sampler import StratifiedBatch, StratifiedSampler, allocate, stratified_weights
from raydist.gradclust.variance import gradient_variance, measure_gradient_variance, weighted_mean

__all__ = [
    "DenseFactors",
    "EmbeddingFactors",
    "Factors",
    "GradientClustering",
    "LayerCapture",
    "RankOneCentres",
    "StratifiedBatch",
    "StratifiedSampler",
    "allocate",
    "assign",
    "gradient_variance",
    "gram_is_cheaper",
    "layer_terms",
    "measure_gradient_variance",
    "scan_layers",
    "squared_distances",
    "stratified_weights",
    "unsupported_layers",
    "weighted_mean",
]
