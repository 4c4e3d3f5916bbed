"""raydist.data: Parquet shard schema, writers, readers, vocab, synthetic generator, converters, validation."""

from raydist.data.manifest import (
    Manifest,
    ShardInfo,
    SplitInfo,
    load_manifest,
    sha256_file,
    write_manifest,
)
from raydist.data.schema import RaydistDataError
from raydist.data.shards import (
    DatasetWriter,
    feature_matrix,
    read_split,
    split_arrays,
    split_files,
    write_split,
)
from raydist.data.synthetic import default_dataset_dir, ensure_default_dataset, make_synthetic
from raydist.data.validate import Problem, ValidationReport, check_split_size, validate_dataset
from raydist.data.vocab import Vocab, tokenize
from raydist.dataset_task import dataset_task

__all__ = [
    "DatasetWriter",
    "Manifest",
    "Problem",
    "RaydistDataError",
    "ShardInfo",
    "SplitInfo",
    "ValidationReport",
    "Vocab",
    "check_split_size",
    "dataset_task",
    "default_dataset_dir",
    "ensure_default_dataset",
    "feature_matrix",
    "load_manifest",
    "make_synthetic",
    "read_split",
    "sha256_file",
    "split_arrays",
    "split_files",
    "tokenize",
    "validate_dataset",
    "write_manifest",
    "write_split",
]
