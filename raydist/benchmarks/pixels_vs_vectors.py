"""Benchmark "pixels-vs-vectors" (issue #35): on an encoded-image dataset (task ``labels`` or ``pairs``), the
run ``raydist train --data DIR`` makes with its defaults -- an image encoder trained from pixels -- against the
``linear`` encoder trained on the same images' flattened pixels (same task, loss and schedule), and the simple
baselines, all scored on the test split.

- **pixels**: :func:`raydist.recipe.run_recipe` on the dataset, the bench's storage and worker keys only;
- **vectors**: every split's images as the pixel run's eval view (its view size, the whole image, normalised)
  flattened into a feature dataset (:func:`raydist.extract.extract_features` with ``nn.Flatten``), trained
  with the pixel run's config except ``model.image_encoder=linear`` and the image-only keys (at their
  defaults, which a feature dataset requires) -- so the same preset, loss, lr, batch and step count;
- **baselines**, fitted on train, scored on test: labels: 1-NN on the raw pixels (cosine, leave one out in the
  split: the runs' ``nn1`` protocol) and on their 32 principal components; pairs: 16-component CCA and ridge
  least squares between the flattened pixels and the captions' bag of words (as ``real-cross-view``; every
  caption row fitted, images scored once with the VSE++ protocol).

Both runs: best checkpoint by val, ``eval.folds=1`` (the baselines' protocol), no event files; in process with
one torch thread (``in_process``), else with the config's Ray Train workers as ``raydist train`` runs them.
Without ``data``: scikit-learn's digits as 32×32 greyscale PNGs (16×16, 200 digits, under ``smoke``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from raydist.benchmarks.catalog import register_benchmark
from raydist.benchmarks.harness import held, ray_instance, row
from raydist.benchmarks.real_cross_view import KEYS as PAIR_KEYS
from raydist.benchmarks.real_cross_view import bag_of_words, one_torch_thread
from raydist.config import Config, ConfigError, load_config
from raydist.console import say
from raydist.data import Vocab, load_manifest, read_split
from raydist.data.image_transforms import ImageTransform, view_shape
from raydist.data.schema import CAPTION, CLEAN_LABEL, IMAGE, IMAGE_ID, LABEL
from raydist.data.stream import split_columns
from raydist.eval.label_metrics import one_nn_accuracy
from raydist.eval.metrics import retrieval_metrics
from raydist.retrieval.index import unit_rows

SMOKE_OVERRIDES = {"train.min_steps": 0, "train.epochs": 1}
# both runs: the baselines' one-fold protocol, no TensorBoard files (neither changes training)
FIXED = {"eval.folds": 1, "train.tensorboard": False}
# keys a feature dataset refuses away from their defaults (raydist.tasks.images.image_config_problems,
# raydist.config._backbone_problems): the vectors run leaves them there
IMAGE_ONLY_KEYS = (
    "data.image_size",
    "data.flip",
    "data.crop",
    "data.crop_pad",
    "data.crop_scale",
    "model.image_weights",
    "model.cnn_width",
    "model.cnn_depth",
    "model.cnn_grid",
    "train.backbone_lr_mult",
    "train.freeze_backbone_epochs",
)
PCA_COMPONENTS = 32
CCA_COMPONENTS = 16
LABEL_KEYS = ("top1", "nn1", "r1")


# -- the flattened-pixel dataset -------------------------------------------------------------------------------


def pixel_transform(cfg: Config, data_dir: str | Path) -> ImageTransform:
    """The pixel run's eval view (:func:`raydist.tasks.images.image_transform`: its view size, normalised) of
    the whole image (``crop_fraction=1``): what the flattened-pixel vectors hold."""
    from raydist.tasks import DataInfo
    from raydist.tasks.images import image_transform

    return dataclasses.replace(
        image_transform(cfg, DataInfo.from_dataset(data_dir), train=False), crop_fraction=1.0
    )


def flatten_pixels(data_dir: str | Path, out_dir: str | Path, transform: ImageTransform) -> Path:
    """Every split of the encoded dataset ``data_dir`` as flattened ``transform`` views (C·H·W floats, channel
    by channel), written as a feature dataset at ``out_dir`` (same splits, ids, captions or labels, vocab)."""
    from raydist.extract import ExtractionEncoder, extract_features

    encoder = ExtractionEncoder(
        nn.Flatten(), transform, {"image_encoder": "flatten", "view": _shape(transform)}
    )
    extract_features(data_dir, out_dir, encoder, overwrite=True, progress=lambda *_, **__: None)
    return Path(out_dir)


def _shape(transform: ImageTransform) -> str:
    """``height×width`` of the views."""
    return "×".join(map(str, view_shape(transform.size)))


def raw_pixels(features: np.ndarray, transform: ImageTransform) -> np.ndarray:
    """Flattened normalised views back to pixels in [0, 1] (``x·std_c + mean_c``), float64 [N, C·H·W]."""
    x = features.astype(np.float64).reshape(len(features), transform.channels, -1)
    x = x * np.asarray(transform.std)[:, None] + np.asarray(transform.mean)[:, None]
    return x.reshape(len(features), -1)


# -- baselines -----------------------------------------------------------------------------------------------------


def label_split(data_dir: str | Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(features float32 [N, D], clean labels [N]) of a feature labels dataset's split."""
    from raydist.data.shards import feature_matrix

    table = read_split(data_dir, split)
    labels = table.column(CLEAN_LABEL if CLEAN_LABEL in table.column_names else LABEL).to_numpy()
    return feature_matrix(table.column(IMAGE)), labels


def pixel_nn1(pixels: np.ndarray, labels: np.ndarray) -> float:
    """1-NN accuracy (%) of ``pixels`` rows, cosine, each row against the split's other rows (the runs' nn1)."""
    return one_nn_accuracy(unit_rows(np.asarray(pixels, dtype=np.float64)), labels)


def pca_nn1(
    train: np.ndarray, test: np.ndarray, labels: np.ndarray, components: int = PCA_COMPONENTS
) -> float:
    """:func:`pixel_nn1` of ``test`` projected on the top ``components`` principal axes of ``train`` (centred on
    the train mean)."""
    mean = train.mean(0)
    _, _, vt = np.linalg.svd(train - mean, full_matrices=False)
    return pixel_nn1((test - mean) @ vt[:components].T, labels)


@contextlib.contextmanager
def _baseline_threads() -> Iterator[None]:
    """One BLAS thread (a 768-column SVD: 0.2 s with one, 15 s with the default count on a busy 2-core box) and
    no convergence warnings from scikit-learn's CCA, inside the block."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # scikit-learn's dependency; without it, BLAS keeps its threads
        threadpool_limits = None  # type: ignore[assignment]
    with threadpool_limits(1) if threadpool_limits else contextlib.nullcontext(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def label_baselines(flat_dir: Path, transform: ImageTransform) -> dict[str, dict[str, float]]:
    train = raw_pixels(label_split(flat_dir, "train")[0], transform)
    test, labels = label_split(flat_dir, "test")
    test = raw_pixels(test, transform)
    k = min(PCA_COMPONENTS, *train.shape)
    nn1 = pixel_nn1(test, labels)
    pca = pca_nn1(train, test, labels, k)
    return {
        "baseline: 1-NN on raw pixels": {"nn1": nn1, "r1": nn1},
        f"baseline: 1-NN on PCA-{k} of raw pixels": {"nn1": pca, "r1": pca},
    }


def pair_split(data_dir: str | Path, split: str, vocab: Vocab) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features float64 [R, D], bag of words [R, V], image index [R]) of a feature pairs dataset's split, one
    row per caption; image index = the position of the row's image among the split's images in order of first
    appearance (an image's features are those of its first row)."""
    cols = split_columns(data_dir, split, (IMAGE_ID, IMAGE, CAPTION))
    _, first, index = np.unique(cols[IMAGE_ID], return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # images by first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return cols[IMAGE].astype(np.float64), bag_of_words(list(cols[CAPTION]), vocab), rank[index]


def _images(x: np.ndarray, image_index: np.ndarray) -> np.ndarray:
    """One feature row per image, in image-index order."""
    _, first = np.unique(image_index, return_index=True)
    return x[first]


def cca_pairs(flat_dir: Path, components: int = CCA_COMPONENTS) -> dict[str, float]:
    """``components``-pair CCA between features and bag of words fitted on every train caption row; test
    images and captions projected, L2-normalised, VSE++ metrics (:func:`real_cross_view.cca_baseline` where
    each image has one caption)."""
    from sklearn.cross_decomposition import CCA

    vocab = Vocab.load(flat_dir / "vocab.json")
    x_train, b_train, _ = pair_split(flat_dir, "train", vocab)
    x_test, b_test, owner = pair_split(flat_dir, "test", vocab)
    keep = b_train.std(0) > 0  # a word absent from train carries nothing (and breaks scaling)
    k = min(components, x_train.shape[1], int(keep.sum()))
    cca = CCA(n_components=k, max_iter=2000).fit(x_train, b_train[:, keep])
    _, cap = cca.transform(x_test, b_test[:, keep])
    img = cca.transform(_images(x_test, owner))
    return retrieval_metrics(unit_rows(img), unit_rows(cap), owner)


def least_squares_pairs(flat_dir: Path, ridge: float = 1e-3) -> dict[str, float]:
    """Ridge map features → bag of words (both centred on the train caption rows' means) fitted on every train
    caption row; score = cos(predicted, real bag of words); VSE++ metrics
    (:func:`real_cross_view.least_squares_baseline` where each image has one caption)."""
    vocab = Vocab.load(flat_dir / "vocab.json")
    x_train, b_train, _ = pair_split(flat_dir, "train", vocab)
    x_test, b_test, owner = pair_split(flat_dir, "test", vocab)
    mx, mb = x_train.mean(0), b_train.mean(0)
    xc = x_train - mx
    w = np.linalg.solve(xc.T @ xc + ridge * len(xc) * np.eye(xc.shape[1]), xc.T @ (b_train - mb))
    return retrieval_metrics(unit_rows((_images(x_test, owner) - mx) @ w), unit_rows(b_test - mb), owner)


def pair_baselines(flat_dir: Path) -> dict[str, dict[str, float]]:
    return {
        f"baseline: CCA-{CCA_COMPONENTS} on flattened pixels": cca_pairs(flat_dir),
        "baseline: least squares on flattened pixels": least_squares_pairs(flat_dir),
    }


# -- the two runs --------------------------------------------------------------------------------------------------


def vectors_config(pixels: Config, flat_dir: Path, preset: str | None) -> Config:
    """The pixel run's config on the flattened-pixel dataset: ``model.image_encoder=linear``, the image-only
    keys at their defaults, every other key (preset, task, loss, schedule, seed) as the pixel run has it."""
    defaults = Config().flat()
    keys = {k: v for k, v in pixels.flat().items() if k not in IMAGE_ONLY_KEYS}
    keys |= {k: defaults[k] for k in IMAGE_ONLY_KEYS if k in defaults}
    keys |= {"data.path": str(flat_dir), "model.image_encoder": "linear"}
    return load_config(preset=preset, overrides=keys)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Training's console output swallowed; shown on stderr when the block raises."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            yield
    except BaseException:
        sys.stderr.write(out.getvalue()[-20000:])
        raise


def train(cfg: Config, in_process: bool) -> dict[str, Any]:
    """One ``run_training`` (quiet): the best checkpoint's test metrics, steps and wall seconds."""
    from raydist.train.trainer import run_training

    started = time.perf_counter()
    with _quiet(), one_torch_thread() if in_process else contextlib.nullcontext():
        outcome = run_training(cfg)
    wall = time.perf_counter() - started
    steps = outcome.history[-1]["step"] if outcome.history else 0
    return {**(outcome.test_metrics or {}), "steps": steps, "wall": wall}


# -- the default dataset -------------------------------------------------------------------------------------------


def digits_images(folder: Path, smoke: bool) -> Path:
    """scikit-learn's digits as greyscale PNGs (bilinearly upscaled from 8×8) on the digit halves' split, as an
    encoded labels dataset: 32×32, 1,100/300/397 digits (``smoke``: 16×16, 140/30/30)."""
    import importlib.util

    if importlib.util.find_spec("sklearn") is None:
        raise ConfigError(
            "pixels-vs-vectors without --data builds scikit-learn's digits as PNGs, and scikit-learn "
            "is not installed: pip install 'raydist[experiments]', or pass --data DIR (an encoded-image "
            "dataset: raydist convert image-folder | karpathy | coco-json --images)"
        )
    from PIL import Image
    from sklearn.datasets import load_digits

    from raydist.converters.image_folder import convert_image_folder
    from raydist.experiments.digit_halves import SPLIT_SIZES, split_indices

    digits = load_digits()
    size, count, sizes = (
        (16, 200, {"val": 30, "test": 30}) if smoke else (32, len(digits.images), SPLIT_SIZES)
    )
    for split, idx in split_indices(count, sizes=sizes).items():
        for k in idx:
            scan = Image.fromarray((digits.images[k] * 255 / 16).round().astype(np.uint8), mode="L")
            path = folder / "src" / split / str(digits.target[k]) / f"{k:04d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            scan.resize((size, size), Image.Resampling.BILINEAR).save(path)
    return convert_image_folder(folder / "src", folder / "data")


# -- the benchmark -------------------------------------------------------------------------------------------------


def _fmt(m: dict[str, Any], key: str) -> str:
    return f"{m[key]:.1f}" if key in m else ""


def _table(task: str, results: dict[str, dict[str, Any]]) -> list[str]:
    keys = LABEL_KEYS if task == "labels" else PAIR_KEYS
    header = (
        ["variant", "test top-1", "nn1", "R@1"]
        if task == "labels"
        else ["variant", "i2t R@1", "R@5", "R@10", "t2i R@1", "R@5", "R@10", "rsum"]
    )
    lines = [row(*header, "steps", "wall s"), "|---" + "|---:" * (len(header) + 1) + "|"]
    for name, m in results.items():
        trained = "wall" in m
        lines.append(
            row(
                name,
                *(_fmt(m, k) for k in keys),
                m["steps"] if trained else "",
                f"{m['wall']:.0f}" if trained else "",
            )
        )
    return lines


def _verdict(
    task: str, pixels: dict[str, Any], vectors: dict[str, Any], baselines: dict[str, dict]
) -> list[str]:
    """Table rows: pixels − vectors and pixels − the best baseline on the metric every row has (labels: test nn1,
    with the top-1 difference; pairs: rsum, with the ratio), and whether pixels reach each."""
    key = "nn1" if task == "labels" else "rsum"
    best_name, best = max(((n, m[key]) for n, m in baselines.items()), key=lambda nm: nm[1])
    p, v = pixels[key], vectors[key]
    extra = ""
    if task == "labels" and "top1" in pixels and "top1" in vectors:
        extra = f" (top-1 {pixels['top1'] - vectors['top1']:+.1f})"
    elif task == "pairs" and v > 0:
        extra = f" (ratio {p / v:.2f}×)"
    return [
        row(f"test {key}", "pixels", "other", "pixels − other", "pixels ≥ other"),
        "|---|---:|---:|---:|---|",
        row(
            "vectors: linear on flattened pixels",
            f"{p:.1f}",
            f"{v:.1f}",
            f"{p - v:+.1f}{extra}",
            held(p >= v),
        ),
        row(f"best {best_name}", f"{p:.1f}", f"{best:.1f}", f"{p - best:+.1f}", held(p >= best)),
    ]


@register_benchmark("pixels-vs-vectors", order=13, options=("data", "in_process"), repeated=False, ray=True)
def pixels_vs_vectors(
    *, smoke: bool, repeats: int, data: str | Path | None = None, in_process: bool = False
) -> str:
    """The image encoder trained from pixels by default vs a linear encoder on flattened pixels, and baselines."""
    from raydist.recipe import run_recipe

    del repeats  # one run of each: the comparison is one invocation
    with tempfile.TemporaryDirectory(prefix="raydist-bench-pixels-") as tmp:
        root = Path(tmp)
        if data is None:
            data, source = digits_images(root / "digits", smoke), "scikit-learn's digits as PNGs (no --data)"
        else:
            data, source = Path(data).expanduser().resolve(), f"`{data}`"
        manifest = load_manifest(data)
        if manifest.image_format != "encoded" or manifest.task not in ("labels", "pairs"):
            raise ConfigError(
                f"{data}: pixels-vs-vectors needs encoded images (manifest image_format 'encoded', "
                f"task labels or pairs), found image_format {manifest.image_format!r}, task "
                f"{manifest.task!r}"
            )
        task = manifest.task
        bench_keys = {
            **FIXED,
            **(SMOKE_OVERRIDES if smoke else {}),
            **({"train.num_workers": 0} if in_process else {}),
        }
        recipe = run_recipe(data, overrides={**bench_keys, "train.storage_path": str(root / "runs")})
        pixels_cfg = recipe.config
        transform = pixel_transform(pixels_cfg, data)
        flat_dir = flatten_pixels(data, root / "flat", transform)
        vectors_cfg = vectors_config(pixels_cfg, flat_dir, recipe.preset)
        encoder = pixels_cfg.model.image_encoder
        view, dim = _shape(transform), transform.channels * int(np.prod(view_shape(transform.size)))

        results: dict[str, dict[str, Any]] = {}
        with _baseline_threads():
            baselines = label_baselines(flat_dir, transform) if task == "labels" else pair_baselines(flat_dir)
        for name, m in baselines.items():
            say(f"[raydist] pixels-vs-vectors: {name}: {_summary(task, m)}")
        names = (f"pixels: {encoder} (defaults)", "vectors: linear on flattened pixels")
        with contextlib.nullcontext() if in_process else ray_instance():
            for name, cfg in zip(names, (pixels_cfg, vectors_cfg), strict=False):
                results[name] = train(cfg, in_process)
                m = results[name]
                say(
                    f"[raydist] pixels-vs-vectors: {name}: {_summary(task, m)}, {m['steps']} steps, "
                    f"{m['wall']:.0f} s",
                )
    results |= baselines
    mode = (
        "in process, one torch thread" if in_process else f"{pixels_cfg.train.num_workers} Ray Train workers"
    )
    flat = pixels_cfg.flat()
    schedule = ", ".join(
        f"{k}={flat[k]}" for k in ("train.epochs", "train.min_steps", "train.batch_size", "train.lr")
    )
    return (
        f"{source}: task {task}, {manifest.image_channels or 3}-channel images, median "
        f"{'×'.join(map(str, manifest.image_size or []))}. `raydist train --data` picks preset `{recipe.preset}` and "
        f"`model.image_encoder={encoder}`; the vectors run: `linear` on each image's eval view ({view}, whole "
        f"image, normalised) flattened to {dim} floats, the same loss and config otherwise ({schedule}). Both "
        f"{mode}, eval.folds=1, best checkpoint by val, test split; baselines fitted on train, scored on test"
        f"{' (nn1: cosine 1-NN, leave one out within the split)' if task == 'labels' else ''}.\n\n"
        + "\n".join(_table(task, results))
        + "\n\n"
        + "\n".join(_verdict(task, results[names[0]], results[names[1]], baselines))
    )


def _summary(task: str, m: dict[str, Any]) -> str:
    if task == "labels":
        return ", ".join(f"{k} {m[k]:.1f}" for k in LABEL_KEYS if k in m)
    return f"rsum {m['rsum']:.1f}"
