"""Benchmarks of the caption side: the GRU against the transformer text encoder trained for the same steps
("text-encoders": test rsum and wall time of whole `raydist train` runs), and where tokenisation runs
("tokenize": captions/s of the subword tokenizer in the streamed data path, Ray Data tasks feeding one
consumer, against calling it in the training process on each step's batch)."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from raydist.benchmarks.catalog import register_benchmark
from raydist.benchmarks.harness import RAY_ENV, median, ray_instance, row, spread
from raydist.config import load_config
from raydist.data import make_synthetic
from raydist.data.tokenizer import train_dataset_tokenizer

VOCAB_SIZE = 1000  # the subword tokenizer trained on the benchmark's copy of the data
ENCODERS = {
    "gru, word vocab (default)": ["model.text_encoder=gru"],
    "transformer 2×256, word vocab": ["model.text_encoder=transformer", "data.tokenizer=vocab"],
    "transformer 2×256, WordPiece": ["model.text_encoder=transformer", "data.tokenizer=subword"],
}


def _env() -> dict[str, str]:
    import os

    env = {**RAY_ENV, **os.environ}
    env.pop("RAY_ADDRESS", None)
    return env


def _copy_with_tokenizer(source: Path, out: Path) -> Path:
    """The dataset copied (the cached one stays as it is) with a WordPiece tokenizer trained on its train
    captions."""
    shutil.copytree(source, out)
    train_dataset_tokenizer(out, VOCAB_SIZE, "wordpiece")
    return out


def _train(args: list[str], out: Path, env: dict[str, str]) -> dict[str, float]:
    """``raydist train ARGS --json OUT`` in a fresh process: test rsum, wall seconds, optimizer steps."""
    launched = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "raydist.cli", "train", *args, "--json", str(out)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    wall = time.time() - launched
    if done.returncode != 0:
        raise RuntimeError(
            f"raydist train {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    outcome = json.loads(out.read_text())
    history = outcome.get("history") or [{}]
    return {"rsum": outcome["test_metrics"]["rsum"], "wall": wall, "steps": history[-1].get("step", 0)}


def _datasets(tmp: Path, smoke: bool) -> list[tuple[str, Path, list[str]]]:
    """(name, dataset folder, preset arguments) of the runs: the embedded synthetic set (``default``) and the
    real digit halves (``small``, the preset `raydist train --data` picks there); smoke: a tiny synthetic set."""
    if smoke:
        data = make_synthetic(
            tmp / "src", images=60, captions_per_image=2, dim=16, seed=0, val_images=8, test_images=8
        )
        return [
            (
                "tiny synthetic, `tiny` in-process",
                data,
                [
                    "--preset",
                    "tiny",
                    "train.epochs=1",
                    "train.num_workers=0",
                    "model.text_width=32",
                    "model.text_heads=2",
                ],
            )
        ]
    from raydist.experiments.datasets import DATA_SOURCES
    from raydist.train.plan import resolve_data_dir

    return [
        (
            "embedded synthetic, `default` (2 workers, 585 steps)",
            Path(resolve_data_dir(load_config("default"))),
            ["--preset", "default"],
        ),
        (
            "digit halves (real), `small`",
            DATA_SOURCES["digit-halves"].build(tmp / "digits", False),
            ["--preset", "small"],
        ),
    ]


@register_benchmark("text-encoders", order=10)
def text_encoders(*, smoke: bool, repeats: int) -> str:
    """GRU vs transformer caption encoders, same steps and seed: test rsum and wall time of `raydist train`."""
    env = _env()
    seeds = [0] if smoke else list(range(repeats))
    table = [
        row(
            "data",
            "text encoder",
            "test rsum, mean (min–max)",
            "wall s, median (min–max)",
            "steps",
            "rsum − gru",
        ),
        "|---|---|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="raydist-bench-text-") as tmp:
        for d, (data_name, source, preset) in enumerate(_datasets(Path(tmp), smoke)):
            data = _copy_with_tokenizer(source, Path(tmp) / f"data-{d}")
            common = [*preset, "--data", str(data), f"train.storage_path={tmp}/runs"]
            results: dict[str, list[dict[str, float]]] = {name: [] for name in ENCODERS}
            for seed in seeds:  # interleaved: load from other processes hits every encoder alike
                for i, (name, extra) in enumerate(ENCODERS.items()):
                    out = Path(tmp) / f"out-{d}-{seed}-{i}.json"
                    results[name].append(_train([*common, *extra, f"train.seed={seed}"], out, env))
            base = statistics.mean(r["rsum"] for r in results[next(iter(ENCODERS))])
            for name, runs in results.items():
                rsums = [r["rsum"] for r in runs]
                mean = statistics.mean(rsums)
                table.append(
                    row(
                        data_name,
                        name,
                        f"{mean:.1f} ({min(rsums):.1f}–{max(rsums):.1f})",
                        spread([r["wall"] for r in runs], "{:.1f}"),
                        int(runs[0]["steps"]),
                        f"{mean - base:+.1f}",
                    )
                )
    return (
        f"Whole `raydist train` runs as subprocesses, one per dataset, encoder and seed (seeds {seeds}); wall "
        "time from launch to exit (Ray start, training, every epoch's validation, the test evaluation). The "
        f"WordPiece tokenizer ({VOCAB_SIZE} tokens) is trained on a copy of each dataset's train captions "
        "(`raydist tokenizer train`).\n\n" + "\n".join(table)
    )


@register_benchmark("tokenize", order=11, ray=True)
def tokenize_rate(*, smoke: bool, repeats: int) -> str:
    """Captions/s of the subword tokenizer in the streamed data path (Ray Data) vs in the training process."""
    import ray.data  # noqa: F401  (Ray Data is what is measured)

    from raydist.benchmarks.harness import pairs_setup
    from raydist.data.stream import train_dataset

    batch = (
        128  # the default preset's rows per worker at 2 workers and global batch 128 is 64; 128 = 1 worker
    )
    with tempfile.TemporaryDirectory(prefix="raydist-bench-tokenize-") as tmp, ray_instance():
        images, captions = (40, 5) if smoke else (6000, 5)
        data = make_synthetic(
            Path(tmp) / "data",
            images=images,
            captions_per_image=captions,
            dim=16,
            seed=0,
            val_images=4,
            test_images=4,
            rows_per_shard=max(images * captions // 8, 50),
        )
        train_dataset_tokenizer(data, VOCAB_SIZE, "wordpiece")
        cfg, task, _ = pairs_setup(data, {"model.text_encoder": "transformer", "data.tokenizer": "subword"})
        transform = task.stream_transform()
        rows = None
        streamed, in_step, features_only = [], [], []
        for _ in range(1 if smoke else repeats):
            start, rows = time.perf_counter(), 0
            for b in train_dataset(data, task.columns, transform).iter_batches(
                batch_size=batch, batch_format="numpy"
            ):
                rows += len(b["tokens"])
            streamed.append(rows / (time.perf_counter() - start))
            # in the training process: the raw rows are in memory; each step tokenises its batch itself
            raw = train_dataset(data, task.columns, lambda x: x).take_batch(rows, batch_format="numpy")
            captions_list = list(raw["caption"])
            start = time.perf_counter()
            for i in range(0, rows, batch):
                transform.tokens(captions_list[i : i + batch])
            in_step.append(rows / (time.perf_counter() - start))
            start = time.perf_counter()
            for i in range(0, rows, batch):
                transform({k: v[i : i + batch] for k, v in raw.items()})
            features_only.append(rows / (time.perf_counter() - start))
    rate = "{:.0f}"
    ms_per_step = 1000 * batch / median(in_step)
    table = [
        row("where", "captions/s, median (min–max)", "ms per step of 128 captions"),
        "|---|---:|---:|",
        row(
            "data path: Ray Data read + transform (tokenise) tasks → one consumer", spread(streamed, rate), ""
        ),
        row(
            "training process: tokenizer on each step's 128 captions",
            spread(in_step, rate),
            f"{ms_per_step:.2f}",
        ),
        row(
            "training process: the whole transform (features + tokens) per step",
            spread(features_only, rate),
            f"{1000 * batch / median(features_only):.2f}",
        ),
    ]
    return (
        f"{rows} train captions of the synthetic generator, WordPiece with {VOCAB_SIZE} tokens, max length "
        f"{cfg.data.max_caption_len}; {1 if smoke else repeats} pass(es). The data path's rate includes reading "
        "the shards; the in-process rows are the shards already read into memory.\n\n" + "\n".join(table)
    )
