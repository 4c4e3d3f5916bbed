"""Deterministic synthetic image-caption dataset with planted structure, and the cached default dataset.

Each image is a unique combination of five attributes (object, colour, size, scene, action). Images
come in groups: a base combination plus variants that differ from it in exactly one attribute, so the
hardest negatives of an image differ from it in one attribute. Features are a fixed random non-linear
map (ReLU of a random projection) of summed attribute vectors, an object×colour interaction vector,
two unmentioned nuisance attributes (lighting, viewpoint) and Gaussian noise. Captions name the
attributes with synonyms, filler words and varied word order, and sometimes drop size or action.
Combinations never repeat across splits, so test images are unseen combinations of seen attributes.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import uuid
from pathlib import Path

import numpy as np

from raydist.data.schema import MANIFEST_NAME, RaydistDataError
from raydist.data.shards import DatasetWriter
from raydist.data.vocab import Vocab

GENERATOR_VERSION = 1

# attribute -> value -> phrases naming it (synonyms)
ATTRIBUTES: dict[str, dict[str, tuple[str, ...]]] = {
    "object": {
        "dog": ("dog", "puppy"),
        "cat": ("cat", "kitten"),
        "horse": ("horse", "pony"),
        "bird": ("bird", "sparrow"),
        "car": ("car", "sedan"),
        "bus": ("bus", "coach"),
        "bicycle": ("bicycle", "bike"),
        "boat": ("boat", "sailboat"),
        "man": ("man", "guy"),
        "woman": ("woman", "lady"),
        "child": ("child", "kid"),
        "truck": ("truck", "lorry"),
    },
    "colour": {
        "red": ("red", "crimson"),
        "blue": ("blue", "navy"),
        "green": ("green", "emerald"),
        "yellow": ("yellow", "golden"),
        "black": ("black", "dark"),
        "white": ("white", "pale"),
        "brown": ("brown", "tan"),
        "orange": ("orange", "amber"),
    },
    "size": {
        "small": ("small", "little", "tiny"),
        "medium": ("medium sized", "average sized", "mid sized"),
        "large": ("large", "big", "huge"),
    },
    "scene": {
        "beach": ("beach", "shore"),
        "park": ("park", "garden"),
        "street": ("street", "road"),
        "kitchen": ("kitchen",),
        "forest": ("forest", "woods"),
        "field": ("field", "meadow"),
        "snow": ("snow", "snowy hill"),
        "city": ("city", "downtown area"),
    },
    "action": {
        "running": ("running", "racing"),
        "sitting": ("sitting", "resting"),
        "standing": ("standing", "waiting"),
        "jumping": ("jumping", "leaping"),
        "sleeping": ("sleeping", "dozing"),
        "eating": ("eating", "feeding"),
    },
}
NAMES = tuple(ATTRIBUTES)
STRENGTH = {"object": 1.0, "colour": 0.85, "scene": 0.75, "action": 0.15, "size": 0.12}
DROPPABLE = ("size", "action")  # minor attributes a caption may leave out
DROP_PROB = 0.1
NUISANCE_VALUES, NUISANCE_STRENGTH = (4, 4), 0.8
INTERACTION_STRENGTH = 0.4
NOISE = 0.5
LATENT_DIM = 96
GROUP_SIZE = 8  # base combination + 7 one-attribute variants
VARIANT_WEIGHTS = (0.2, 0.2, 0.2, 0.2, 0.2)  # which attribute a variant changes (order of NAMES)

FILLERS = ("", "", "a photo of", "an image of", "a picture showing", "there is", "we can see")
PREPOSITIONS = ("in", "on", "at", "near")
TEMPLATES = (
    "{F} a {S} {C} {O} {A} {prep} the {P}",
    "{prep} the {P} there is a {S} {C} {O} {A}",
    "a {C} {S} {O} {A} {prep} the {P}",
    "{F} the {P} with a {S} {O} colored {C} {A}",
    "{A} {prep} the {P} is a {S} {C} {O}",
    "{S} {C} {O} {A} {P}",
)

_ARTICLE = re.compile(r"\ba (?=[aeiou])")

# the default dataset's arguments; its val/test sizes follow the proportional rule of split_sizes
DEFAULTS = {
    "images": 3000,
    "captions_per_image": 5,
    "dim": 128,
    "seed": 0,
    "val_images": 500,
    "test_images": 1000,
}
VAL_PER_TRAIN, TEST_PER_TRAIN = 6, 3  # val_images = images // 6, test_images = images // 3 unless given


def _draw_combinations(rng: np.random.Generator, counts: list[int]) -> list[np.ndarray]:
    """Per split, ``[n, 5]`` attribute value indices in groups of GROUP_SIZE, unique over all splits."""
    sizes = np.array([len(ATTRIBUTES[a]) for a in NAMES])
    if sum(counts) > 0.5 * np.prod(sizes):
        raise RaydistDataError(
            f"{sum(counts)} images (train, val, test: {', '.join(map(str, counts))}) need "
            f"too many of the {np.prod(sizes)} attribute combinations; use fewer images"
        )
    used: set[tuple[int, ...]] = set()
    out = []
    for n in counts:
        rows: list[tuple[int, ...]] = []
        while len(rows) < n:
            base = tuple(int(v) for v in rng.integers(0, sizes))
            if base in used:
                continue
            group = [base]
            for _ in range(100):  # attempts at one-attribute variants
                if len(group) == GROUP_SIZE:
                    break
                a = int(rng.choice(len(NAMES), p=VARIANT_WEIGHTS))
                variant = list(base)
                variant[a] = int((base[a] + rng.integers(1, sizes[a])) % sizes[a])
                if tuple(variant) not in used and tuple(variant) not in group:
                    group.append(tuple(variant))
            group = group[: n - len(rows)]
            used.update(group)
            rows.extend(group)
        # scatter the groups so that a streaming reader's local shuffle does not batch them together
        out.append(np.array(rows, dtype=np.int64).reshape(n, len(NAMES))[rng.permutation(n)])
    return out


def _features(rng: np.random.Generator, combos: list[np.ndarray], dim: int) -> list[np.ndarray]:
    """Image features ``relu(h A + b)`` with h = weighted attribute + interaction + nuisance vectors + noise."""

    def unit(*shape: int) -> np.ndarray:
        return rng.normal(size=shape) / np.sqrt(LATENT_DIM)

    vectors = {a: unit(len(ATTRIBUTES[a]), LATENT_DIM) * STRENGTH[a] for a in NAMES}
    pair = unit(len(ATTRIBUTES["object"]), len(ATTRIBUTES["colour"]), LATENT_DIM) * INTERACTION_STRENGTH
    nuisance = [unit(k, LATENT_DIM) * NUISANCE_STRENGTH for k in NUISANCE_VALUES]
    proj = rng.normal(size=(LATENT_DIM, dim)) * np.sqrt(2.0)
    bias = rng.normal(size=dim) * 0.1
    out = []
    for c in combos:
        n = len(c)
        h = sum(vectors[a][c[:, i]] for i, a in enumerate(NAMES)) + pair[c[:, 0], c[:, 1]]
        h = h + sum(v[rng.integers(0, len(v), n)] for v in nuisance) + unit(n, LATENT_DIM) * NOISE
        # einsum without BLAS: bit-identical results whatever the thread count
        out.append(np.maximum(np.einsum("nh,hd->nd", h, proj) + bias, 0.0).astype(np.float32))
    return out


def _caption(r: random.Random, combo: np.ndarray) -> str:
    """One caption for an attribute combination: a random template, synonyms, filler, maybe a drop."""
    words = {
        a: r.choice(ATTRIBUTES[a][list(ATTRIBUTES[a])[int(v)]]) for a, v in zip(NAMES, combo, strict=False)
    }
    if r.random() < DROP_PROB:
        words[r.choice(DROPPABLE)] = ""
    text = r.choice(TEMPLATES).format(
        F=r.choice(FILLERS),
        S=words["size"],
        C=words["colour"],
        O=words["object"],
        A=words["action"],
        P=words["scene"],
        prep=r.choice(PREPOSITIONS),
    )
    return _ARTICLE.sub("an ", " ".join(text.split()))


def split_sizes(images: int, val_images: int | None, test_images: int | None) -> tuple[int, int]:
    """Val and test images: as given, else proportional to the train images, ``images // 6`` val and
    ``images // 3`` test (at least 1 each; the default 3000 train images give 500 and 1000)."""
    val = max(images // VAL_PER_TRAIN, 1) if val_images is None else val_images
    test = max(images // TEST_PER_TRAIN, 1) if test_images is None else test_images
    return val, test


def make_synthetic(
    out_dir: str | Path,
    *,
    images: int = DEFAULTS["images"],
    captions_per_image: int = DEFAULTS["captions_per_image"],
    dim: int = DEFAULTS["dim"],
    seed: int = DEFAULTS["seed"],
    val_images: int | None = None,
    test_images: int | None = None,
    min_count: int = 1,
    rows_per_shard: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Generate the synthetic dataset (``images`` train images, one row per caption) into ``out_dir``.

    ``val_images``/``test_images`` None: proportional to ``images`` (:func:`split_sizes`). Deterministic:
    the same arguments give byte-identical shards and manifest (it records the val/test sizes used).
    Returns ``out_dir``.
    """
    val_images, test_images = split_sizes(images, val_images, test_images)
    if min(images, val_images, test_images, captions_per_image, dim) < 1:
        raise RaydistDataError("images, val_images, test_images, captions_per_image and dim must be >= 1")
    args = {
        "images": images,
        "captions_per_image": captions_per_image,
        "dim": dim,
        "seed": seed,
        "val_images": val_images,
        "test_images": test_images,
    }
    rng = np.random.default_rng(seed)
    counts = [images, val_images, test_images]
    combos = _draw_combinations(rng, counts)
    feats = _features(rng, combos, dim)
    text_rng = random.Random(int(rng.integers(2**63)))
    source = {
        "generator": "raydist.data.synthetic",
        "generator_version": GENERATOR_VERSION,
        **args,
        "attributes": {a: list(v) for a, v in ATTRIBUTES.items()},
    }
    writer_args = {"rows_per_shard": rows_per_shard} if rows_per_shard else {}
    with DatasetWriter(out_dir, source=source, overwrite=overwrite, **writer_args) as writer:
        first_image = 0
        for split, combo, feat in zip(("train", "val", "test"), combos, feats, strict=False):
            n = len(combo)
            captions = [_caption(text_rng, c) for c in combo for _ in range(captions_per_image)]
            image_ids = np.repeat(np.arange(first_image, first_image + n), captions_per_image)
            if split == "train":
                writer.vocab = Vocab.build(captions, min_count)
            writer.add_split(
                split,
                image_ids,
                image_ids * captions_per_image + np.tile(np.arange(captions_per_image), n),
                feat,
                captions,
                feature_index=np.repeat(np.arange(n), captions_per_image),
            )
            first_image += n
    return Path(out_dir)


def cache_dir() -> Path:
    """``$RAYDIST_CACHE`` if set, else ``~/.cache/raydist``."""
    return Path(os.environ.get("RAYDIST_CACHE") or Path.home() / ".cache" / "raydist")


def default_dataset_dir() -> Path:
    """Cache folder of the default synthetic dataset: ``synthetic-v<version>-<hash of its arguments>``."""
    key = json.dumps({"generator_version": GENERATOR_VERSION, **DEFAULTS}, sort_keys=True)
    return cache_dir() / f"synthetic-v{GENERATOR_VERSION}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def ensure_default_dataset() -> Path:
    """The default synthetic dataset, generated on first use; concurrent callers and crashed runs never
    expose a partial dataset (it is built in a private folder and renamed into place)."""
    final = default_dataset_dir()
    if (final / MANIFEST_NAME).is_file():  # its manifest is read (and checked) by whoever uses it
        return final
    tmp = final.with_name(f".{final.name}.build-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        make_synthetic(tmp, **DEFAULTS)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / MANIFEST_NAME).is_file():  # not a concurrent winner: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
