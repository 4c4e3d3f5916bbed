#!/usr/bin/env bash
# The GPU check (raydist/benchmarks/gpu.py): on one GPU machine, in under 8 minutes, the suite's GPU tests, a
# `raydist train` run on nccl, faiss-gpu flat/IVF, the tiled MH loss at 2^20 rows, image encoder images/s and
# gradient caching's memory and step time (train.grad_cache_chunk off vs 128),
# written to OUT_DIR/gpu_check.md. Without a GPU it prints why and exits 0.
# Usage: bash bench/gpu_check.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m raydist.benchmarks.gpu "${1:?usage: bash bench/gpu_check.sh OUT_DIR}"
