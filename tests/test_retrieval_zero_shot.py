"""raydist.retrieval.zero_shot (``raydist eval --zero-shot``): a pairs model's prompts as a classifier of a
labelled dataset's images; top-1/top-5 as CLIP_benchmark reports them, against an argmax computed by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from raydist.cli import main
from raydist.config import ConfigError
from raydist.data import feature_matrix, make_synthetic, read_split
from raydist.data.synthetic_labels import make_synthetic_labels
from raydist.retrieval.trained import load_trained
from raydist.retrieval.zero_shot import class_names, zero_shot_eval, zero_shot_scores

CLASSES = 7
TEMPLATES = ["a photo of a {}", "a {} in the park"]


def test_scores_are_clip_benchmarks_top_k_and_per_class_recall():
    logits = np.array([[0.9, 0.1, 0.0], [0.2, 0.3, 0.5], [0.1, 0.8, 0.7], [0.0, 0.6, 0.9]])
    labels = np.array([0, 0, 2, 1])
    scores = zero_shot_scores(logits, labels)
    # argmax 0, 2, 1, 2: one of four right; top-5 of 3 classes holds every label
    assert scores == {"acc1": 0.25, "acc5": 1.0, "mean_per_class_recall": pytest.approx((0.5 + 0 + 0) / 3)}


def test_class_classnamesfrom_a_list_or_a_file(tmp_path):
    (tmp_path / "names.txt").write_text("dog\n\ncar\n")
    assert class_names("dog, car") == class_names(str(tmp_path / "names.txt")) == ["dog", "car"]


def test_zero_shot_accuracy_equals_a_hand_computed_argmax(tmp_path, fresh_checkpoint):
    pairs = make_synthetic(tmp_path / "pairs", images=40, captions_per_image=3, dim=16, seed=0)
    words = " ".join(read_split(pairs, "train", verify=False).column("caption").to_pylist()).split()
    classnames = list(dict.fromkeys(w for w in words if len(w) > 3))[
        :CLASSES
    ]  # in the vocabulary: no tied prompts
    labelled = make_synthetic_labels(
        tmp_path / "labels",
        classes=CLASSES,
        train_per_class=4,
        val_per_class=3,
        test_per_class=9,
        dim=16,
        seed=2,
    )
    ckpt = fresh_checkpoint(tmp_path / "run" / "checkpoint_00000001", pairs)
    got = zero_shot_eval(ckpt, labelled, classnames, templates=TEMPLATES)

    # by hand: the model's own sides, CLIP's prompt ensemble, numpy's argmax and sort
    trained = load_trained(ckpt)
    table = read_split(labelled, "test", verify=False)
    labels = table.column("label").to_numpy()
    with torch.no_grad():
        images = trained.model.image(torch.tensor(feature_matrix(table.column("image")))).numpy()
    text = trained.task.embed_texts(
        trained.model, [t.format(n) for n in classnames for t in TEMPLATES]
    ).numpy()
    text = text / np.linalg.norm(text, axis=1, keepdims=True)
    classes = text.reshape(len(classnames), len(TEMPLATES), -1).mean(axis=1)
    classes /= np.linalg.norm(classes, axis=1, keepdims=True)
    logits = (images / np.linalg.norm(images, axis=1, keepdims=True)) @ classes.T
    top1 = float(np.mean(logits.argmax(axis=1) == labels))
    top5 = float(np.mean([label in np.argsort(-row)[:5] for row, label in zip(logits, labels, strict=True)]))
    assert got["acc1"] == pytest.approx(top1, abs=1e-12) and got["acc5"] == pytest.approx(top5, abs=1e-12)
    assert 0 < got["acc5"] < 1 and got["acc1"] < got["acc5"]

    out = tmp_path / "zs.json"
    names = ",".join(classnames)
    args = [
        "eval",
        "--checkpoint",
        str(ckpt),
        "--data",
        str(labelled),
        "--zero-shot",
        names,
        "--json",
        str(out),
    ]
    assert main([*args, *(a for t in TEMPLATES for a in ("--template", t))]) == 0
    assert json.loads(out.read_text()) == got
    with pytest.raises(ConfigError, match=f"3 class names for the {CLASSES} classes"):
        zero_shot_eval(ckpt, labelled, classnames[:3])
