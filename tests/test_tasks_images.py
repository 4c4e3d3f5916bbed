"""Training on encoded images (raydist/tasks/images.py and the tasks' encoded paths): coloured shapes written as
16×16 PNGs with captions naming colour and shape, converted with `convert_karpathy`. One caption per image per
epoch, drawn by the documented rule; per-epoch augmentation of the in-memory split; one eval query per caption;
a small CNN that learns in-process; the image-encoder / data-format refusals; end to end from PNGs with 2 Ray
workers: pairs (streamed) against CCA on the raw pixels, labels against the raw pixels' nearest neighbour."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from PIL import Image

from raydist.config import ConfigError, load_config
from raydist.converters.image_folder import convert_image_folder
from raydist.converters.karpathy import convert_karpathy
from raydist.data import Vocab, dataset_task, read_split
from raydist.data.image_transforms import decode_image, default_mean_std, eval_view, train_view, view_rng
from raydist.data.stream import InMemoryBatches, train_arrays
from raydist.eval.metrics import retrieval_metrics
from raydist.tasks import DataInfo, build_task
from raydist.tasks.images import check_image_config, crop_size, image_transform
from raydist.train.hooks import ValidationHook
from raydist.train.local import LocalRuntime
from raydist.train.loop import run_loop
from raydist.train.plan import step_plan
from raydist.train.trainer import run_training

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (40, 60, 230)}
SHAPES = ("square", "disc", "bar")
SIZE = 16


def shape_image(colour: str, shape: str, rng: np.random.Generator) -> np.ndarray:
    """A 16×16 RGB picture: a grey noisy background and one coloured shape at a random place."""
    img = rng.integers(90, 150, (SIZE, SIZE, 3)).astype(np.uint8)
    yy, xx = np.mgrid[:SIZE, :SIZE]
    cy, cx = rng.integers(6, 10, 2)
    if shape == "square":
        mask = (abs(yy - cy) <= 4) & (abs(xx - cx) <= 4)
    elif shape == "disc":
        mask = (yy - cy) ** 2 + (xx - cx) ** 2 <= 20
    else:
        mask = (abs(yy - cy) <= 1) & (abs(xx - cx) <= 6)
    img[mask] = COLOURS[colour]
    return img


def write_shapes(root, *, per_class: dict[str, int], seed: int = 0):
    """A Karpathy JSON + PNGs: per split, ``per_class[split]`` images of each colour × shape with 2 or 3
    captions naming both (so images hold different numbers of captions). Returns the JSON's path."""
    rng = np.random.default_rng(seed)
    entries, k = [], 0
    for split, n in per_class.items():
        for colour in COLOURS:
            for shape in SHAPES:
                for _ in range(n):
                    name = f"{k:04d}.png"
                    Image.fromarray(shape_image(colour, shape, rng)).save(root / name)
                    captions = [f"a {colour} {shape}", f"{shape} in {colour}", f"the {colour} {shape} here"]
                    count = 2 + k % 2
                    entries.append(
                        {
                            "filename": name,
                            "split": split,
                            "imgid": k,
                            "sentences": [{"raw": c} for c in captions[:count]],
                        }
                    )
                    k += 1
    src = root / "dataset.json"
    src.write_text(json.dumps({"images": entries}))
    return src


def write_shape_pairs(root, *, per_class: dict[str, int], rows_per_shard: int):
    """:func:`write_shapes` under ``root/images`` converted to an encoded pairs dataset at ``root/data``."""
    (root / "images").mkdir()
    src = write_shapes(root / "images", per_class=per_class)
    return convert_karpathy(src, root / "images", root / "data", min_count=1, rows_per_shard=rows_per_shard)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """An encoded pairs dataset: 9 colour × shape classes; train 12 images each, val and test 4 each."""
    return write_shape_pairs(
        tmp_path_factory.mktemp("shapes"), per_class={"train": 12, "val": 4, "test": 4}, rows_per_shard=40
    )


def pairs_config(data, **overrides):
    return load_config(
        "tiny",
        overrides={
            "data.path": str(data),
            "model.image_encoder": "small-cnn",
            "train.num_workers": 0,
            **overrides,
        },
    )


def expected_caption(seed: int, epoch: int, sample_id: int, count: int) -> int:
    """The rule stated in epoch_caption_index's docstring, written out again."""
    cycle, position = divmod(epoch, count)
    return int(np.random.default_rng([seed, cycle, sample_id, 1]).permutation(count)[position])


def one_batch_epochs(cfg, task):
    """The in-memory split as one batch per epoch (all rows, world 1), as the runtimes build it."""
    arrays = train_arrays(task.info.data_dir, task.columns, task.transform)
    n = len(arrays["sample_id"])
    return InMemoryBatches(
        arrays, rows=n, rank=0, world=1, seed=cfg.train.seed, epoch_transform=task.epoch_transform()
    )


def the_batch(batches, epoch):
    """The one batch of ``epoch``."""
    (batch,) = batches.epoch(epoch)
    return batch


def test_one_caption_per_image_per_epoch_follows_the_seeded_rule(shapes):
    cfg = pairs_config(shapes, **{"train.seed": 5})
    task = build_task(cfg, DataInfo.from_dataset(shapes))
    table = read_split(shapes, "train")
    captions = dict(
        zip(table.column("sample_id").to_pylist(), table.column("captions").to_pylist(), strict=False)
    )
    vocab = Vocab.load(shapes / "vocab.json")
    batches = one_batch_epochs(cfg, task)
    used: dict[int, set[str]] = {sid: set() for sid in captions}
    for epoch in range(6):  # two full cycles of 3 captions, three of 2
        batch = the_batch(batches, epoch)
        want = [
            captions[sid][expected_caption(5, epoch, sid, len(captions[sid]))] for sid in batch["sample_id"]
        ]
        tokens, lengths = vocab.encode_batch(want, cfg.data.max_caption_len)
        assert np.array_equal(batch["lengths"], lengths)
        assert np.array_equal(batch["tokens"][:, : tokens.shape[1]], tokens)
        for sid, text in zip(batch["sample_id"], want, strict=False):
            used[int(sid)].add(text)
        if epoch in (1, 5):  # after each full cycle every caption of every image has been used
            assert all(
                used[sid] == set(captions[sid]) for sid in captions if epoch == 5 or len(captions[sid]) == 2
            )
    # a new run (another runtime, e.g. after a restart) draws the same captions for the same epoch
    again = the_batch(one_batch_epochs(cfg, task), 4)
    assert np.array_equal(again["tokens"], the_batch(batches, 4)["tokens"])


def test_every_epoch_draws_new_views_and_a_rerun_the_same_pixels(shapes):
    cfg = pairs_config(shapes, **{"train.seed": 2, "data.crop": "resized", "data.flip": True})
    task = build_task(cfg, DataInfo.from_dataset(shapes))
    table = read_split(shapes, "train")
    raw = dict(zip(table.column("sample_id").to_pylist(), table.column("image").to_pylist(), strict=False))
    first = one_batch_epochs(cfg, task)
    e0, e1 = the_batch(first, 0), the_batch(first, 1)
    rerun = the_batch(one_batch_epochs(cfg, task), 1)
    size = crop_size(cfg, task.info)
    assert e0["image"].shape == (len(raw), 3, size, size) == (len(raw), 3, SIZE, SIZE)
    mean, std = default_mean_std(3)
    for epoch, batch in ((0, e0), (1, e1)):
        for row in (0, 7, len(raw) - 1):
            sid = int(batch["sample_id"][row])
            want = train_view(
                decode_image(raw[sid], 3), size, view_rng(2, epoch, sid), flip=True, mean=mean, std=std
            )
            np.testing.assert_array_equal(batch["image"][row], want)
    by_id = [
        {int(s): img for s, img in zip(b["sample_id"], b["image"], strict=False)} for b in (e0, e1, rerun)
    ]
    changed = [not np.array_equal(by_id[0][s], by_id[1][s]) for s in raw]
    assert sum(changed) > 0.9 * len(raw), "epoch 1 must not reuse epoch 0's crops"
    assert all(np.array_equal(by_id[1][s], by_id[2][s]) for s in raw)


def test_encoded_eval_has_one_query_per_caption_and_exact_metrics(shapes):
    cfg = pairs_config(shapes, **{"eval.folds": 2})
    task = build_task(cfg, DataInfo.from_dataset(shapes))
    torch.manual_seed(0)
    model = task.build_model()
    table = read_split(shapes, "test")
    captions = table.column("captions").to_pylist()
    found = task.embed(model, "test")
    assert len(found.database) == table.num_rows == 36
    assert len(found.queries) == sum(len(c) for c in captions)
    assert found.query_keys.tolist() == [i for i, c in enumerate(captions) for _ in c]
    assert found.database_ids.tolist() == table.column("image_id").to_pylist()
    # the database rows are the eval views' embeddings; the metrics are those of the embeddings (5-fold protocol
    # with 2 folds here), and the t2i R@1 a brute-force count over the scores
    metrics = task.evaluate(model, "test")
    texts = [c for caps in captions for c in caps]  # repeated shape captions: caption-level metrics too
    want = retrieval_metrics(
        torch.as_tensor(found.database),
        torch.as_tensor(found.queries),
        found.query_keys,
        folds=2,
        captions=texts,
    )
    assert metrics == pytest.approx(want) and "cap_rsum" in metrics
    half = 18
    hits = []
    for q, key in enumerate(found.query_keys):
        fold = key // half
        scores = found.database[fold * half : (fold + 1) * half] @ found.queries[q]
        hits.append(int(np.argmax(scores)) == key - fold * half)
    assert metrics["t2i_r1"] == pytest.approx(100 * np.mean(hits))


def test_a_small_cnn_learns_shapes_and_colours_in_process(shapes, tmp_path):
    cfg = pairs_config(
        shapes, **{"train.epochs": 1, "train.batch_size": 27, "train.lr": 0.003, "data.flip": False}
    )
    task = build_task(cfg, DataInfo.from_dataset(shapes))
    torch.manual_seed(cfg.train.seed)
    before = task.evaluate(task.build_model(), "val")["rsum"]
    plan = step_plan(cfg, task.info.task)
    runtime = LocalRuntime(cfg, task, plan, tmp_path / "run")
    started = time.perf_counter()
    out = run_loop(cfg, task, runtime, plan, hooks=[ValidationHook(task)])
    print(
        f"1 epoch in {time.perf_counter() - started:.1f} s; val rsum {before:.1f} → "
        f"{[round(m['val/rsum'], 1) for m in out['history']]}"
    )
    assert out["history"][-1]["val/rsum"] > before + 60


@pytest.fixture(scope="module")
def colour_folders(tmp_path_factory):
    """An encoded labels dataset from an ImageFolder tree: 3 colour classes of 16×16 PNG shapes, 24 images each."""
    return write_colour_folders(tmp_path_factory.mktemp("colours"), seed=1)


def write_colour_folders(root, *, seed: int):
    """3 colour classes of 16×16 PNG shapes, 24 images each, under ``root/src``, converted to ``root/data``
    (split by image: a quarter val, a quarter test)."""
    rng = np.random.default_rng(seed)
    for colour in COLOURS:
        (root / "src" / colour).mkdir(parents=True)
        for k in range(24):
            Image.fromarray(shape_image(colour, SHAPES[k % 3], rng)).save(root / "src" / colour / f"{k}.png")
    return convert_image_folder(
        root / "src", root / "data", split_by="image", val_fraction=0.25, test_fraction=0.25
    )


def test_labels_on_encoded_images_train_and_evaluate_eval_views(colour_folders, tmp_path):
    cfg = load_config(
        "tiny",
        overrides={
            "data.path": str(colour_folders),
            "model.image_encoder": "small-cnn",
            "train.num_workers": 0,
            "train.epochs": 1,
            "train.batch_size": 12,
            "train.lr": 0.003,
            "eval.recall_at": [1, 2],
        },
        task_of=dataset_task,
    )
    info = DataInfo.from_dataset(colour_folders)
    check_image_config(cfg, info)
    task = build_task(cfg, info)
    plan = step_plan(cfg, task.info.task)
    runtime = LocalRuntime(cfg, task, plan, tmp_path / "run")
    batch = next(iter(runtime.train_batches(0)))
    assert batch["image"].shape == (12, 3, SIZE, SIZE) and batch["label"].dtype == np.int64
    out = run_loop(cfg, task, runtime, plan, hooks=[ValidationHook(task)])
    assert out["history"][-1]["val/top1"] > 33.3 + 30, out["history"]  # 3 classes: chance 33 %
    # evaluation embeds each image's eval view (the whole image: 16 px images train with pad-and-crop at their
    # own scale), computed here from the pixels
    model = task.build_model()
    table = read_split(colour_folders, "val")
    emb, _, labels = task.embed_split(model, "val")
    mean, std = default_mean_std(3)
    views = np.stack(
        [
            eval_view(decode_image(b, 3), SIZE, mean=mean, std=std, crop_fraction=1.0)
            for b in table.column("image").to_pylist()
        ]
    )
    with torch.no_grad():
        want, _ = model.eval()(torch.as_tensor(views))
    torch.testing.assert_close(emb, want)
    assert labels.tolist() == table.column("label").to_pylist()


def test_an_image_encoder_must_fit_the_data(shapes, tiny_dataset):
    encoded, features = DataInfo.from_dataset(shapes), DataInfo.from_dataset(tiny_dataset)
    check_image_config(pairs_config(shapes), encoded)
    with pytest.raises(ConfigError, match=r"model.image_encoder=linear: .*encoded images.*small-cnn"):
        check_image_config(pairs_config(shapes, **{"model.image_encoder": "linear"}), encoded)
    with pytest.raises(
        ConfigError, match=r"model.image_encoder=small-cnn: .*feature vectors.*feature_dim 32"
    ):
        check_image_config(pairs_config(tiny_dataset), features)
    with pytest.raises(
        ConfigError, match=r"model.image_encoder=resnet: unknown image encoder; known: .*small-cnn"
    ):
        check_image_config(pairs_config(shapes, **{"model.image_encoder": "resnet"}), encoded)
    check_image_config(pairs_config(shapes, **{"data.in_memory_max_mb": 0}), encoded)  # streams: no refusal
    with pytest.raises(ConfigError, match=r"model.image_weights=.*nope.pt: no such file"):
        check_image_config(pairs_config(shapes, **{"model.image_weights": str(shapes / "nope.pt")}), encoded)


def test_an_encoder_that_cannot_be_built_is_refused_before_ray_starts(shapes, tmp_path, monkeypatch, capsys):
    """The encoder is built on the meta device during the checks: a package that does not import, a model its
    library does not know and a weights file of another architecture are ConfigErrors naming the key. The CLI
    exits 2 with them (this test is not `slow`: starting Ray would fail it)."""
    import sys
    import types

    from raydist.cli import main
    from raydist.models.image_encoders import build_image_encoder, image_encoder_problem

    encoded = DataInfo.from_dataset(shapes)
    image_encoder_problem.cache_clear()
    for module in ("torchvision", "torchvision.models"):  # an import of torchvision fails here
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(
        ConfigError, match=r"model.image_encoder=torchvision:resnet18: .*needs torchvision.*pip install"
    ):
        check_image_config(pairs_config(shapes, **{"model.image_encoder": "torchvision:resnet18"}), encoded)

    def get_model(name, weights=None, **kwargs):
        raise ValueError(f"Unknown model {name}")

    fake = types.ModuleType("torchvision.models")
    fake.get_model = get_model
    monkeypatch.setitem(sys.modules, "torchvision", types.ModuleType("torchvision"))
    monkeypatch.setitem(sys.modules, "torchvision.models", fake)
    with pytest.raises(
        ConfigError, match=r"model.image_encoder=torchvision:resnet19: Unknown model resnet19"
    ):
        check_image_config(pairs_config(shapes, **{"model.image_encoder": "torchvision:resnet19"}), encoded)

    wide = tmp_path / "wide.pt"  # a small-cnn backbone of width 48, for a run that builds width 32
    torch.save(build_image_encoder("small-cnn", 8, channels=3, width=48).backbone.state_dict(), wide)
    with pytest.raises(
        ConfigError, match=r"model.image_weights=.*wide.pt does not fit small-cnn \(wrong shape: "
    ):
        check_image_config(pairs_config(shapes, **{"model.image_weights": str(wide)}), encoded)
    assert (
        main(["train", "--data", str(shapes), "model.image_encoder=small-cnn", f"model.image_weights={wide}"])
        == 2
    )
    assert "does not fit small-cnn" in capsys.readouterr().err
    image_encoder_problem.cache_clear()


def test_crop_scale_reaches_the_train_views(shapes, tiny_dataset):
    """`data.crop_scale` is the random resized crop's area range: a run's train view equals the reference view
    drawn with that range (and not the default's); eval views and feature datasets do not take it."""
    info = DataInfo.from_dataset(shapes)
    table = read_split(shapes, "train")
    image, sample_id = table.column("image")[0].as_py(), table.column("sample_id")[0].as_py()
    mean, std = default_mean_std(3)

    def reference(scale):
        return train_view(
            decode_image(image, 3),
            SIZE,
            view_rng(0, 2, sample_id),
            flip=True,
            mean=mean,
            std=std,
            scale=scale,
        )

    views = {}
    for scale in ((0.08, 1.0), (0.7, 0.7)):
        cfg = pairs_config(
            shapes,
            **{"data.crop_scale": list(scale), "train.seed": 0, "data.crop": "resized", "data.flip": True},
        )
        views[scale] = image_transform(cfg, info, train=True).view(image, sample_id, 2)
        np.testing.assert_array_equal(views[scale], reference(scale))
    assert not np.array_equal(views[(0.08, 1.0)], views[(0.7, 0.7)])
    with pytest.raises(ConfigError, match=r"data.crop_scale=\[0.9, 0.5\]: need 0 < lo <= hi <= 1"):
        pairs_config(shapes, **{"data.crop_scale": [0.9, 0.5]})
    with pytest.raises(ConfigError, match=r"data.crop_scale=\(0.5, 1.0\): .*feature vectors"):
        check_image_config(
            pairs_config(tiny_dataset, **{"data.crop_scale": [0.5, 1.0], "model.image_encoder": "linear"}),
            DataInfo.from_dataset(tiny_dataset),
        )


ORIENTATIONS = ("horizontal", "vertical", "diagonal", "antidiagonal")


def bar_image(orientation: str, cy: int, cx: int, rng: np.random.Generator, size: int = SIZE) -> np.ndarray:
    """A ``size``² RGB picture: uniform grey noise (64–191) and one 3-pixel-thick bar centred at (cy, cx), white
    or black at random. The random polarity makes every pixel's expected value the same for every caption, so no
    linear map of the pixels can read orientation or place; a CNN's rectified filters can."""
    img = rng.integers(64, 192, (size, size, 3)).astype(np.uint8)
    yy, xx = np.mgrid[:size, :size]
    dy, dx = yy - cy, xx - cx
    mask = {
        "horizontal": (abs(dy) <= 1) & (abs(dx) <= 4),
        "vertical": (abs(dx) <= 1) & (abs(dy) <= 4),
        "diagonal": (abs(dy - dx) <= 1) & (abs(dx + dy) <= 6),
        "antidiagonal": (abs(dy + dx) <= 1) & (abs(dx - dy) <= 6),
    }[orientation]
    img[mask] = 255 if rng.random() < 0.5 else 0
    return img


@pytest.fixture(scope="module")
def bars(tmp_path_factory):
    """An encoded pairs dataset (Karpathy JSON + PNGs): a bar of 4 orientations in 4 quadrants, one caption
    naming both ("a diagonal bar top left"); 12 train images per caption, 4 val and 4 test."""
    root = tmp_path_factory.mktemp("bars")
    images = root / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    entries = []
    for split, n in {"train": 12, "val": 4, "test": 4}.items():
        for orientation in ORIENTATIONS:
            for vertical in ("top", "bottom"):
                for horizontal in ("left", "right"):
                    for _ in range(n):
                        cy = int(rng.integers(4, 8)) + (4 if vertical == "bottom" else 0)
                        cx = int(rng.integers(4, 8)) + (4 if horizontal == "right" else 0)
                        k = len(entries)
                        Image.fromarray(bar_image(orientation, cy, cx, rng)).save(images / f"{k:04d}.png")
                        caption = f"a {orientation} bar {vertical} {horizontal}"
                        entries.append(
                            {
                                "filename": f"{k:04d}.png",
                                "split": split,
                                "imgid": k,
                                "sentences": [{"raw": caption}],
                            }
                        )
    (root / "dataset.json").write_text(json.dumps({"images": entries}))
    return convert_karpathy(root / "dataset.json", images, root / "data", min_count=1)


def pixel_cca_metrics(data, components: int = 8) -> dict[str, float]:
    """The linear baseline: CCA between raw pixels and bag-of-words captions, fitted on train (scikit-learn),
    both test views projected and L2-normalised, the same retrieval metrics (one caption per image)."""
    from sklearn.cross_decomposition import CCA

    from raydist.benchmarks.real_cross_view import bag_of_words

    vocab = Vocab.load(data / "vocab.json")

    def views(split):
        table = read_split(data, split)
        pixels = np.stack(
            [decode_image(b, 3).astype(np.float64).ravel() for b in table.column("image").to_pylist()]
        )
        return pixels, bag_of_words([c[0] for c in table.column("captions").to_pylist()], vocab)

    x_train, b_train = views("train")
    x_test, b_test = views("test")
    keep = b_train.std(0) > 0
    cca = CCA(n_components=min(components, int(keep.sum())), max_iter=2000).fit(x_train, b_train[:, keep])
    img, cap = cca.transform(x_test, b_test[:, keep])
    unit = [v / np.linalg.norm(v, axis=1, keepdims=True) for v in (img, cap)]
    return retrieval_metrics(*unit, np.arange(len(img)))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ray_workers_stream_pngs_and_beat_a_linear_cca(ray_cluster, bars, tmp_path):
    """End to end from PNG files: `run_training` with 2 Ray Train workers on the streamed split
    (`data.in_memory_max_mb=0`: Ray Data's tasks decode and make each epoch's views, alternate epochs on two
    splits), small-cnn, SH loss (captions repeat across images, so MH's hardest negative would often be a false
    one). The test rsum of the best checkpoint beats CCA on the raw pixels by a wide margin."""
    cfg = pairs_config(
        bars,
        **{
            "train.num_workers": 2,
            "train.epochs": 10,
            "train.batch_size": 32,
            "train.lr": 0.003,
            "train.storage_path": str(tmp_path),
            "loss.hardest": False,
            "data.flip": False,
            "eval.folds": 1,
            "data.in_memory_max_mb": 0,
            "data.transform_concurrency": 1,
        },
    )
    outcome = run_training(cfg)
    assert [(m["epoch"], m["step"]) for m in outcome.history] == [(e, e * (192 // 32)) for e in range(1, 11)]
    baseline = pixel_cca_metrics(bars)["rsum"]
    assert outcome.test_metrics["rsum"] > baseline + 50, (baseline, outcome.test_metrics, outcome.history)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_streamed_epochs_make_the_same_views_as_the_in_memory_cache(ray_cluster, shapes):
    """The stream as training opens it (two splits for alternate epochs, each pass's epoch announced to its Ray
    Data tasks, which decode and make the views): for every row and epoch, the views and the caption drawn equal
    those the in-memory path makes from its decoded cache (same seed, epoch, sample id)."""
    from raydist.data.stream import StreamedEpochs, train_streams

    cfg = pairs_config(shapes, **{"data.shuffle_buffer": 0})
    task = build_task(cfg, DataInfo.from_dataset(shapes))
    memory = one_batch_epochs(cfg, task)
    rows = len(read_split(shapes, "train"))
    epochs = 3
    datasets, views = train_streams(
        shapes,
        task.columns,
        task.stream_transform(),
        task.epoch_transform(),
        epochs=epochs,
        seed=cfg.train.seed,
    )
    assert list(datasets) == list(views) == ["train", "train_next"]
    stream = StreamedEpochs(
        [datasets[n].streaming_split(1, equal=True)[0] for n in datasets],
        rows=rows,
        shuffle_buffer=0,
        seed=cfg.train.seed,
        rank=0,
        epochs=epochs,
        views=[views[n] for n in datasets],
    )
    for epoch in range(epochs):
        (streamed,) = list(stream.epoch(epoch))
        assert "epoch" not in streamed
        cached = the_batch(memory, epoch)
        order = {s: i for i, s in enumerate(cached["sample_id"].tolist())}
        at = [order[s] for s in streamed["sample_id"].tolist()]
        assert sorted(at) == list(range(rows))
        for key in ("image", "tokens", "lengths", "image_id"):
            np.testing.assert_array_equal(streamed[key], cached[key][at], err_msg=f"{key}, epoch {epoch}")
    assert not np.array_equal(the_batch(memory, 0)["image"], the_batch(memory, 1)["image"])  # epochs differ


def test_a_streamed_block_of_another_epoch_is_refused():
    """The worker checks the epoch its blocks' views were made for and drops the column."""
    from raydist.data.stream import _checked_epoch

    good = {"sample_id": np.arange(3), "epoch": np.full(3, 2)}
    (block,) = list(_checked_epoch([good], 2))
    assert "epoch" not in block
    with pytest.raises(RuntimeError, match=r"epoch 2 delivered views of epoch\(s\) \[1, 2\]"):
        list(_checked_epoch([{"sample_id": np.arange(2), "epoch": np.array([1, 2])}], 2))
    with pytest.raises(RuntimeError, match="no epoch column"):
        list(_checked_epoch([{"sample_id": np.arange(2)}], 0))


def test_train_on_images_picks_an_encoder_when_none_is_named(shapes, tiny_dataset, capsys):
    """`raydist train --data IMAGES` with no encoder named: small-cnn for 16 px images, said in one line; an
    encoder on the command line is kept, and feature data is left alone."""
    from raydist.cli import main

    assert main(["train", "--data", str(shapes), "--print-config"]) == 0
    out = capsys.readouterr()
    assert "[raydist] images: median 16×16 colour (shorter side ≤ 64)" in out.err
    assert "model.image_encoder=small-cnn" in out.err
    assert "image_encoder: small-cnn" in out.out
    assert (
        main(["train", "--data", str(shapes), "--print-config", "model.image_encoder=torchvision:resnet18"])
        == 0
    )
    out = capsys.readouterr()
    assert "image_encoder: torchvision:resnet18" in out.out  # named: kept; the from-scratch rules still hold
    assert (
        "model.image_encoder=torchvision:resnet18 trains from scratch → train.early_stop_patience" in out.err
    )
    assert main(["train", "--data", str(tiny_dataset), "--print-config"]) == 0
    out = capsys.readouterr()
    assert "[raydist] images:" not in out.err and "image_encoder: linear" in out.out


def test_an_encoder_from_scratch_gets_a_step_floor_unless_the_run_sets_one(colour_folders, capsys):
    """The picked encoder trains from scratch: a labels run (the default preset sets no step floor for labels)
    gets train.min_steps=585, said in the same line; a floor on the command line, or a preset's own as high (the
    default preset's pairs block: 585), stays."""
    import yaml

    from raydist.cli import main

    def picked(*extra):
        assert main(["train", "--data", str(colour_folders), "--print-config", *extra]) == 0
        out = capsys.readouterr()
        return yaml.safe_load(out.out)["train"]["min_steps"], out.err

    steps, line = picked()
    assert steps == 585 and "train.min_steps=585" in line
    steps, line = picked("train.min_steps=50")
    assert steps == 50 and "train.min_steps" not in line


def test_the_image_encoder_rule_follows_the_image_size():
    from raydist.presets import image_encoder_for_data

    steps = {"train.min_steps": 585}  # every choice trains from scratch
    small = image_encoder_for_data([28, 28], 1, torchvision=True)
    assert small.overrides == {"model.image_encoder": "small-cnn", **steps} and "greyscale" in small.reason
    big = image_encoder_for_data([375, 500], 3, torchvision=True)
    assert big.overrides == {"model.image_encoder": "torchvision:resnet18", "data.image_size": 224, **steps}
    mid = image_encoder_for_data([120, 160], 3, torchvision=True)
    assert mid.overrides["data.image_size"] == 120
    none = image_encoder_for_data([375, 500], 3, torchvision=False)
    assert none.overrides == {"model.image_encoder": "small-cnn", "data.image_size": 64, **steps}
    assert 'pip install -e ".[vision]"' in none.line()
