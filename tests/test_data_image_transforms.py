"""raydist/data/image_transforms.py: decode, the train and eval views and the batch callable, each against an
independent computation (Pillow's own decode and resize, slicing and normalisation written out here)."""

from __future__ import annotations

import io
import math
import pickle
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from raydist.data.image_transforms import (
    ImageTransform,
    decode_image,
    decode_images,
    eval_view,
    normalize,
    normalize_views,
    random_resized_crop_box,
    train_view,
    view_rng,
)

MEAN3, STD3 = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _pixels(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _encode(pixels: np.ndarray, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def _normalised(pixels: np.ndarray, mean, std) -> np.ndarray:
    """(x / 255 − mean_c) / std_c channel by channel, in float64, as C×H×W."""
    return np.stack([(pixels[:, :, c] / 255.0 - mean[c]) / std[c] for c in range(pixels.shape[2])])


def _pillow_resize(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    if pixels.shape[2] == 1:
        return np.asarray(
            Image.fromarray(pixels[:, :, 0]).resize((width, height), Image.Resampling.BILINEAR)
        )[:, :, None]
    return np.asarray(Image.fromarray(pixels).resize((width, height), Image.Resampling.BILINEAR))


def test_decode_gives_pillows_own_pixels_in_the_mode_asked():
    rgb = _pixels(13, 21)
    png = _encode(rgb)
    assert decode_image(png, 3).dtype == np.uint8 and np.array_equal(decode_image(png, 3), rgb)
    grey = np.asarray(Image.fromarray(rgb).convert("L"))
    assert decode_image(png, 1).shape == (13, 21, 1) and np.array_equal(decode_image(png, 1)[:, :, 0], grey)
    grey_png = _encode(grey)
    assert np.array_equal(decode_image(grey_png, 3), np.repeat(grey[:, :, None], 3, axis=2))
    jpeg = _encode(rgb, "JPEG")
    assert np.array_equal(decode_image(jpeg, 3), np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB")))
    with pytest.raises(ValueError, match="channels must be 1"):
        decode_image(png, 2)


def test_decode_images_keeps_one_array_per_row_even_when_shapes_agree():
    column = [_encode(_pixels(8, 8, s)) for s in range(3)]
    decoded = decode_images(column, 3)
    assert decoded.shape == (3,) and decoded.dtype == object
    assert all(np.array_equal(decoded[i], _pixels(8, 8, i)) for i in range(3))


def test_normalize_is_x_over_255_minus_mean_over_std_per_channel():
    pixels = _pixels(5, 7)
    got = normalize(pixels, MEAN3, STD3)
    assert got.dtype == np.float32 and got.shape == (3, 5, 7)
    np.testing.assert_allclose(got, _normalised(pixels, MEAN3, STD3), rtol=0, atol=1e-6)
    # a batch at once (the streamed path's worker side): the per-image floats, bit for bit
    batch = np.stack([_pixels(5, 7, seed=k) for k in range(4)])  # [4, 5, 7, 3]
    views = normalize_views(np.ascontiguousarray(batch.transpose(0, 3, 1, 2)), MEAN3, STD3)
    assert views.dtype == np.float32 and np.array_equal(
        views, np.stack([normalize(b, MEAN3, STD3) for b in batch])
    )


def test_crop_boxes_stay_inside_with_area_and_ratio_in_bounds():
    """Over many seeds and image shapes whose aspect ratio is inside ``ratio`` (so even the fallback, the whole
    image, keeps both bounds): the box is inside the image; w/h and the area fraction are within the bounds up
    to the rounding of w and h to integers."""
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    shapes = np.random.default_rng(1)
    areas = []
    for seed in range(3000):
        height = int(shapes.integers(24, 200))
        width = int(np.clip(height * np.exp(shapes.uniform(np.log(0.75), np.log(4 / 3))), 24, None))
        top, left, h, w = random_resized_crop_box(height, width, np.random.default_rng(seed), scale, ratio)
        assert top >= 0 and top + h <= height and left >= 0 and left + w <= width and h > 0 and w > 0
        assert (w + 0.5) / (h - 0.5) >= ratio[0] and (w - 0.5) / (h + 0.5) <= ratio[1]
        area = height * width
        assert (w + 0.5) * (h + 0.5) >= scale[0] * area and (w - 0.5) * (h - 0.5) <= scale[1] * area
        areas.append(h * w / area)
    assert min(areas) < 0.15 and max(areas) > 0.9 and 0.3 < np.mean(areas) < 0.7  # U(0.08, 1) has mean 0.54


def test_crop_box_with_a_fixed_scale_and_the_centre_crop_fallback():
    for seed in range(50):
        box = random_resized_crop_box(100, 100, np.random.default_rng(seed), (0.25, 0.25), (1.0, 1.0))
        assert box[2:] == (50, 50)
    # 10 px high, 200 px wide: no try of ≥ 99% of the area fits a ratio ≤ 4/3, so the fallback is the centre
    # crop of height 10 and width round(10 · 4/3) = 13, at left (200 − 13) // 2 = 93.
    assert random_resized_crop_box(10, 200, np.random.default_rng(0), (0.99, 1.0)) == (0, 93, 10, 13)
    assert random_resized_crop_box(200, 10, np.random.default_rng(0), (0.99, 1.0)) == (93, 0, 13, 10)


def _reference_train_view(pixels, size, seed, epoch, sample_id, mean, std):
    """The unflipped train view: the box drawn first from the row's generator, the crop by slicing, Pillow's
    resize, normalisation written out."""
    top, left, h, w = random_resized_crop_box(*pixels.shape[:2], view_rng(seed, epoch, sample_id))
    return _normalised(_pillow_resize(pixels[top : top + h, left : left + w], size, size), mean, std)


def test_train_view_without_flip_is_the_unflipped_reference_and_with_flip_mirrors_about_half():
    pixels = _pixels(40, 52)
    flipped = 0
    for sample_id in range(60):
        ref = _reference_train_view(pixels, 16, 5, 2, sample_id, MEAN3, STD3)
        plain = train_view(pixels, 16, view_rng(5, 2, sample_id), flip=False, mean=MEAN3, std=STD3)
        np.testing.assert_allclose(plain, ref, rtol=0, atol=1e-5)
        maybe = train_view(pixels, 16, view_rng(5, 2, sample_id), flip=True, mean=MEAN3, std=STD3)
        if np.allclose(maybe, ref[:, :, ::-1], rtol=0, atol=1e-5) and not np.allclose(
            maybe, ref, rtol=0, atol=1e-5
        ):
            flipped += 1
        else:
            np.testing.assert_allclose(maybe, ref, rtol=0, atol=1e-5)
    assert 15 <= flipped <= 45


def test_train_view_is_a_function_of_seed_epoch_and_row():
    png = _encode(_pixels(30, 30))
    t = ImageTransform(size=12, channels=3, train=True, flip=True, seed=3)
    first = t.view(png, 7, epoch=0)
    assert first.shape == (3, 12, 12) and first.dtype == np.float32
    assert np.array_equal(first, t.view(png, 7, epoch=0))
    assert np.array_equal(first, pickle.loads(pickle.dumps(t)).view(png, 7, epoch=0))
    assert not np.array_equal(first, t.view(png, 7, epoch=1))
    assert not np.array_equal(first, t.view(png, 8, epoch=0))
    assert not np.array_equal(first, ImageTransform(12, 3, True, True, seed=4).view(png, 7, epoch=0))


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize(
    ("height", "width", "fraction", "new_w", "new_h", "top", "left"),
    [
        (
            40,
            60,
            0.875,
            27,
            18,
            1,
            6,
        ),  # short side round(16 / 0.875) = 18, long int(18 · 60 / 40) = 27; round(5.5) = 6
        (60, 40, 0.875, 18, 27, 6, 1),
        (16, 16, 0.875, 18, 18, 1, 1),  # upsampled
        (40, 70, 0.875, 31, 18, 1, 8),  # the long side truncated: int(31.5) = 31; round(7.5) = 8
        (30, 50, 0.9, 30, 18, 1, 7),  # round(16 / 0.9) = round(17.8) = 18
        (50, 30, 1.0, 16, 26, 5, 0),  # no margin: int(16 · 50 / 30) = 26
    ],
)
def test_eval_view_is_resize_then_centre_crop(channels, height, width, fraction, new_w, new_h, top, left):
    pixels = decode_image(_encode(_pixels(height, width)), channels)
    mean, std = (MEAN3, STD3) if channels == 3 else ((0.5,), (0.5,))
    want = _normalised(_pillow_resize(pixels, new_w, new_h)[top : top + 16, left : left + 16], mean, std)
    got = eval_view(pixels, 16, mean=mean, std=std, crop_fraction=fraction)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    t = ImageTransform(size=16, channels=channels, train=False, flip=True, seed=0, crop_fraction=fraction)
    batch = {"image": np.array([_encode(_pixels(height, width))], dtype=object), "sample_id": np.array([4])}
    out = t(batch)["image"]
    assert out.shape == (1, channels, 16, 16)
    np.testing.assert_allclose(out[0], want, rtol=0, atol=1e-5)
    assert np.array_equal(out, t.for_epoch(3)(batch)["image"])  # eval views do not depend on the epoch


def test_mean_and_std_are_overridable():
    pixels = _pixels(20, 20)
    t = ImageTransform(size=16, channels=3, train=False, flip=False, seed=0, mean=(0, 0, 0), std=(1, 1, 1))
    want = _pillow_resize(pixels, 18, 18)[1:17, 1:17].transpose(2, 0, 1) / 255.0
    np.testing.assert_allclose(t.view(pixels, 0, 0), want, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="need 1 values"):
        ImageTransform(size=16, channels=1, train=False, flip=False, seed=0, mean=MEAN3, std=STD3)


def _batch(rows: slice | None = None) -> dict[str, np.ndarray]:
    shapes = [(20, 30), (32, 32), (17, 40), (50, 25), (24, 24)]
    batch = {
        "image": np.array([_encode(_pixels(h, w, i)) for i, (h, w) in enumerate(shapes)], dtype=object),
        "sample_id": np.array([7, 3, 11, 0, 42], dtype=np.int64),
        "caption": np.array(["a", "b", "c", "d", "e"], dtype=object),
    }
    return batch if rows is None else {k: v[rows] for k, v in batch.items()}


def test_batch_callable_matches_the_per_row_functions_in_any_batch_split():
    t = ImageTransform(size=12, channels=3, train=True, flip=True, seed=9, scale=(0.2, 1.0))
    batch = _batch()
    whole = t(batch, epoch=2)
    assert whole["image"].shape == (5, 3, 12, 12) and whole["image"].dtype == np.float32
    assert whole["caption"] is batch["caption"] and whole["sample_id"] is batch["sample_id"]
    for i, (data, sample_id) in enumerate(zip(batch["image"], batch["sample_id"], strict=False)):
        want = train_view(
            decode_image(data, 3),
            12,
            view_rng(9, 2, int(sample_id)),
            flip=True,
            mean=MEAN3,
            std=STD3,
            scale=(0.2, 1.0),
        )
        assert np.array_equal(whole["image"][i], want)
    parts = np.concatenate(
        [t(_batch(slice(0, 3)), epoch=2)["image"], t(_batch(slice(3, 5)), epoch=2)["image"]]
    )
    assert np.array_equal(parts, whole["image"])
    assert np.array_equal(t.for_epoch(2)(batch)["image"], whole["image"])
    assert not np.array_equal(t(batch)["image"], whole["image"])  # epoch 0 by default
    cached = {**batch, "image": decode_images(batch["image"], 3)}  # the in-memory path's decoded cache
    assert np.array_equal(t(cached, epoch=2)["image"], whole["image"])


def test_uint8_views_normalised_per_batch_equal_the_float_views():
    """The streamed path moves uint8 views and normalises whole batches in the worker: the same float32 values,
    bit for bit, and the uint8 views are the resized crops before normalising."""
    batch = _batch()
    for channels, mean, std in ((3, None, None), (1, None, None), (3, (0.1, 0.2, 0.3), (0.5, 0.6, 0.7))):
        floats = ImageTransform(size=12, channels=channels, train=True, flip=True, seed=9, mean=mean, std=std)
        small = ImageTransform(
            size=12, channels=channels, train=True, flip=True, seed=9, mean=mean, std=std, uint8=True
        )
        views = small(batch, epoch=3)["image"]
        assert views.dtype == np.uint8 and views.shape == (5, channels, 12, 12)
        want = floats(batch, epoch=3)["image"]
        got = small.normalize_batch(views)
        assert got.dtype == np.float32 and np.array_equal(got, want)
        m, sd = floats.mean, floats.std
        np.testing.assert_allclose(
            want, np.stack([_normalised(v.transpose(1, 2, 0), m, sd) for v in views]), atol=1e-5
        )


def test_train_batches_need_sample_ids():
    batch = _batch()
    del batch["sample_id"]
    with pytest.raises(KeyError, match="sample_id"):
        ImageTransform(size=8, channels=3, train=True, flip=False, seed=0)(batch)


def test_invalid_settings_are_refused():
    for kwargs in (
        {"channels": 2},
        {"size": 0},
        {"scale": (0.5, 0.1)},
        {"ratio": (0.0, 1.0)},
        {"crop_fraction": 1.5},
    ):
        with pytest.raises(ValueError):
            ImageTransform(**{"size": 8, "channels": 3, "train": True, "flip": False, "seed": 0, **kwargs})


def test_the_transform_unpickles_without_torch():
    """What a Ray Data task runs: unpickling the transform in a fresh interpreter imports no torch."""
    t = ImageTransform(size=8, channels=1, train=True, flip=False, seed=0).for_epoch(1)
    check = (
        "import pickle, sys; t = pickle.loads(sys.stdin.buffer.read()); "
        "print(t.epoch, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", check], input=pickle.dumps(t), capture_output=True, check=True
    )
    assert out.stdout.decode().split() == ["1", "False"], out.stderr.decode()[-500:]
    assert math.isclose(t.mean[0], 0.5) and math.isclose(t.std[0], 0.5)
