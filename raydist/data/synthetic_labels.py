"""Deterministic synthetic class-labelled dataset (task ``labels``) with a controlled class overlap.

Each sample is a latent vector (a class part plus class-independent nuisance) passed through a fixed
random non-linear map into ``dim`` features; ``overlap`` is the overlapping coefficient of two classes.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist

import numpy as np

from raydist.data.schema import RaydistDataError
from raydist.data.shards import DatasetWriter

GENERATOR_VERSION = 1
NUISANCE_DIMS = 4
NUISANCE_STD = 0.5
MAP_GAIN = 1.0  # standard deviation of every pre-activation of the feature map


def class_mixing(overlap: float) -> tuple[float, float]:
    """``(cos θ, sin θ)`` of the class part ``cos θ · e_y + sin θ · ε`` (ε ~ N(0, I_K)) whose overlap is ``overlap``.

    Two classes a ≠ b are Gaussians with means ``cos θ · e_a``, ``cos θ · e_b`` (distance ``Δ = √2 cos θ``)
    and covariance ``sin²θ · I``; their overlapping coefficient ``∫ min(p_a, p_b) = 2 Φ(−Δ / (2 sin θ))``
    is set equal to ``overlap``, so ``cot θ = √2 · Φ⁻¹(1 − overlap / 2)``: θ = 0 at overlap 0, π/2 at 1.
    """
    if overlap == 0.0:
        return 1.0, 0.0
    cot = math.sqrt(2.0) * NormalDist().inv_cdf(1.0 - overlap / 2.0)
    norm = math.hypot(cot, 1.0)
    return cot / norm, 1.0 / norm


def _latent(rng: np.random.Generator, labels: np.ndarray, classes: int, cos: float, sin: float) -> np.ndarray:
    """Latent rows ``[cos θ · e_y + sin θ · ε, NUISANCE_STD · ν]`` with ε ~ N(0, I_K), ν ~ N(0, I_4)."""
    n = len(labels)
    class_part = cos * np.eye(classes)[labels] + sin * rng.normal(size=(n, classes))
    return np.concatenate([class_part, NUISANCE_STD * rng.normal(size=(n, NUISANCE_DIMS))], axis=1)


def _balanced_labels(rng: np.random.Generator, classes: int, per_class: int) -> np.ndarray:
    """``per_class`` rows of every class, in a random order."""
    return rng.permutation(np.repeat(np.arange(classes), per_class))


def make_synthetic_labels(
    out: str | Path,
    *,
    classes: int = 10,
    train_per_class: int = 100,
    val_per_class: int = 20,
    test_per_class: int = 40,
    dim: int = 32,
    overlap: float = 0.5,
    duplicates: int = 1,
    seed: int = 0,
    rows_per_shard: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Generate a task-``labels`` dataset with ``classes`` balanced classes into ``out`` and return ``out``.

    Latent sample of class y: ``z = [cos θ · e_y + sin θ · ε, 0.5 · ν]`` (ε ~ N(0, I_K), ν ~ N(0, I_4)
    nuisance shared by all classes); features ``x = tanh(z A + b)`` with fixed random ``A`` [K+4, dim]
    (i.i.d. normal, scaled so that every pre-activation has unit variance) and ``b``. ``overlap`` ∈ [0, 1] is the overlapping coefficient ``∫ min(p_a, p_b)`` of any two
    classes in latent space (see :func:`class_mixing`): with equal priors the Bayes error of telling two
    classes apart is ``overlap / 2``; 0 = separated (no class noise), 1 = indistinguishable. The map is
    injective when ``dim >= classes + 4``, so features overlap exactly as much; with a smaller ``dim``
    they overlap at least as much. ``duplicates`` > 1 repeats each distinct train example that many times
    (identical features and label, distinct ids). Rows of each split are shuffled; ``image_id`` =
    ``sample_id`` = a running row number over train, val, test; ``clean_label`` = ``label``.
    Deterministic: the same arguments give byte-identical shards and manifest.
    """
    if classes < 2:
        raise RaydistDataError(f"classes must be >= 2, got {classes}")
    sizes = {
        "train_per_class": train_per_class,
        "val_per_class": val_per_class,
        "test_per_class": test_per_class,
        "dim": dim,
        "duplicates": duplicates,
    }
    for name, value in sizes.items():
        if value < 1:
            raise RaydistDataError(f"{name} must be >= 1, got {value}")
    if not 0.0 <= overlap <= 1.0:
        raise RaydistDataError(f"overlap must lie in [0, 1], got {overlap}")
    rng = np.random.default_rng(seed)
    latent_dim = classes + NUISANCE_DIMS
    cos, sin = class_mixing(overlap)
    latent_norm = math.sqrt(cos**2 + classes * sin**2 + NUISANCE_DIMS * NUISANCE_STD**2)  # √E‖z‖²
    proj = rng.normal(size=(latent_dim, dim)) * (MAP_GAIN / latent_norm)
    bias = rng.normal(size=dim) * 0.1
    source = {
        "generator": "raydist.data.synthetic_labels",
        "generator_version": GENERATOR_VERSION,
        "classes": classes,
        **sizes,
        "overlap": overlap,
        "seed": seed,
        "latent_dim": latent_dim,
        "overlap_meaning": "overlapping coefficient of two classes in latent space "
        "(pairwise Bayes error = overlap / 2)",
    }
    writer_args = {"rows_per_shard": rows_per_shard} if rows_per_shard else {}
    with DatasetWriter(
        out, task="labels", num_classes=classes, source=source, overwrite=overwrite, **writer_args
    ) as writer:
        first = 0
        for split, per_class in (
            ("train", train_per_class),
            ("val", val_per_class),
            ("test", test_per_class),
        ):
            labels = _balanced_labels(rng, classes, per_class)
            # einsum without BLAS: bit-identical results whatever the thread count
            feats = np.tanh(np.einsum("nh,hd->nd", _latent(rng, labels, classes, cos, sin), proj) + bias)
            index = np.arange(len(labels))
            if split == "train" and duplicates > 1:
                index = rng.permutation(np.repeat(index, duplicates))
            ids = first + np.arange(len(index))
            writer.add_split(
                split,
                ids,
                ids,
                feats.astype(np.float32),
                labels=labels[index],
                clean_labels=labels[index],
                feature_index=index,
            )
            first += len(index)
    return Path(out)
