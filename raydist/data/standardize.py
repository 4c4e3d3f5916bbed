"""Per-feature standardisation of feature vectors: fit on a dataset's train rows, the ``standardization.json``
file that keeps the statistics next to the manifest, and :func:`standardize_features` for new vectors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raydist.data.manifest import load_manifest
from raydist.data.schema import MANIFEST_NAME, RaydistDataError

STANDARDIZATION_NAME = "standardization.json"
SCALE_SPREAD_WARNING = 100.0  # warn when max/min per-feature train std exceeds this


@dataclass(frozen=True)
class FeatureStandardization:
    """``z = (x − mean) / std`` per feature, with mean and (population, ddof 0) std of the train rows in
    float64; a feature constant on train (``zero_variance``) keeps std 1, so it is only centred."""

    mean: np.ndarray
    std: np.ndarray
    zero_variance: tuple[int, ...]
    train_rows: int

    @property
    def feature_dim(self) -> int:
        """Number of features D."""
        return len(self.mean)

    def apply(self, features: np.ndarray) -> np.ndarray:
        """``(features − mean) / std`` in float64, for ``features`` of shape [N, D] or [D]."""
        x = np.asarray(features)
        if x.dtype.kind not in "fiu" or x.ndim not in (1, 2) or x.shape[-1] != self.feature_dim:
            raise RaydistDataError(
                f"standardisation: expected numeric features of shape "
                f"[N, {self.feature_dim}] or [{self.feature_dim}], got {x.dtype} {x.shape}"
            )
        return (x.astype(np.float64) - self.mean) / self.std

    def to_json(self) -> dict[str, Any]:
        """What ``standardization.json`` holds (floats written exactly: JSON keeps a float64's repr)."""
        return {
            "formula": "(x - mean) / std",
            "fitted_on": "train",
            "train_rows": self.train_rows,
            "feature_dim": self.feature_dim,
            "zero_variance": list(self.zero_variance),
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
        }


def fit_standardization(train_features: np.ndarray) -> FeatureStandardization:
    """Mean and population std (ddof 0) of each column of ``train_features`` [N, D] in float64; a column
    whose train values are all equal has zero variance and gets std 1."""
    x = np.asarray(train_features, dtype=np.float64)
    if x.ndim != 2 or 0 in x.shape:
        raise RaydistDataError(
            f"standardisation: expected a non-empty [rows, dim] train matrix, got {x.shape}"
        )
    constant = np.ptp(x, axis=0) == 0
    std = np.where(constant, 1.0, x.std(axis=0))
    zero_variance = tuple(int(i) for i in np.flatnonzero(constant))
    return FeatureStandardization(x.mean(axis=0), std, zero_variance, len(x))


def feature_scale_spread(train_features: np.ndarray) -> float:
    """max / min of the per-feature train std over the features that are not constant on train (1.0 when
    fewer than two vary): how many times larger the widest feature is than the narrowest."""
    x = np.asarray(train_features, dtype=np.float64)
    std = x.std(axis=0)[np.ptp(x, axis=0) > 0]
    return float(std.max() / std.min()) if len(std) > 1 else 1.0


def standardization_from_json(raw: Any, where: str) -> FeatureStandardization:
    """Check and build the statistics read from ``where``; errors name the file and field."""
    if not isinstance(raw, dict):
        raise RaydistDataError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    arrays = {}
    for name in ("mean", "std"):
        value = raw.get(name)
        if not isinstance(value, list) or not value or not all(isinstance(v, (int, float)) for v in value):
            raise RaydistDataError(f"{where}: field {name!r}: expected a non-empty list of numbers")
        arrays[name] = np.asarray(value, dtype=np.float64)
        if not np.isfinite(arrays[name]).all():
            raise RaydistDataError(f"{where}: field {name!r}: expected finite numbers")
    if len(arrays["mean"]) != len(arrays["std"]):
        raise RaydistDataError(
            f"{where}: fields 'mean' and 'std' have {len(arrays['mean'])} and "
            f"{len(arrays['std'])} entries; expected one per feature each"
        )
    if (arrays["std"] <= 0).any():
        raise RaydistDataError(f"{where}: field 'std': entry {int(np.argmax(arrays['std'] <= 0))} is not > 0")
    zero, rows = raw.get("zero_variance", []), raw.get("train_rows", 0)
    if not isinstance(zero, list) or not all(type(i) is int and 0 <= i < len(arrays["std"]) for i in zero):
        raise RaydistDataError(f"{where}: field 'zero_variance': expected a list of feature indices")
    if type(rows) is not int or rows < 0:
        raise RaydistDataError(f"{where}: field 'train_rows': expected an integer >= 0, got {rows!r}")
    return FeatureStandardization(arrays["mean"], arrays["std"], tuple(zero), rows)


def write_standardization(dataset_dir: str | Path, stats: FeatureStandardization) -> Path:
    """Write ``standardization.json`` into ``dataset_dir`` and return its path."""
    path = Path(dataset_dir) / STANDARDIZATION_NAME
    path.write_text(json.dumps(stats.to_json()) + "\n")
    return path


def load_standardization(path: str | Path) -> FeatureStandardization | None:
    """The statistics of a dataset folder (None when it was not standardised) or of a
    ``standardization.json`` file itself (e.g. the copy a checkpoint keeps)."""
    path = Path(path)
    if (path / MANIFEST_NAME).is_file():
        manifest = load_manifest(path)
        if manifest.standardization is None:
            return None
        stats = load_standardization(path / manifest.standardization)
        if stats is not None and stats.feature_dim != manifest.feature_dim:
            raise RaydistDataError(
                f"{path / manifest.standardization}: {stats.feature_dim} features, but "
                f"the manifest's feature_dim is {manifest.feature_dim}"
            )
        return stats
    if not path.is_file():
        raise RaydistDataError(f"{path}: neither a dataset folder nor a {STANDARDIZATION_NAME} file")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RaydistDataError(f"{path}: not valid JSON: {e}") from e
    return standardization_from_json(raw, str(path))


def standardize_features(features: np.ndarray, source: str | Path | FeatureStandardization) -> np.ndarray:
    """Apply a dataset's saved standardisation to new vectors ``features`` [N, D] (or [D]): float32
    ``(x − mean_train) / std_train``, the transform ``raydist convert npz --standardize`` applied to every
    split. ``source`` is a dataset folder, its ``standardization.json`` (or a checkpoint's copy) or loaded
    statistics; a dataset folder that was not standardised returns ``features`` as float32, unchanged."""
    stats = source if isinstance(source, FeatureStandardization) else load_standardization(source)
    if stats is None:
        return np.asarray(features, dtype=np.float32)
    return stats.apply(features).astype(np.float32)
