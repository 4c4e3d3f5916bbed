"""Zero-shot classification with an image–caption (``pairs``) model on a labelled dataset
(``raydist eval --zero-shot CLASSNAMES --template "a photo of a {}"``): each class's prompts embedded by the
text side make its classifier; images are classified by their cosine to each class, as CLIP_benchmark does."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from raydist.config import ConfigError
from raydist.data import feature_matrix, read_split
from raydist.data.image_transforms import decode_image
from raydist.data.schema import CLEAN_LABEL, IMAGE, LABEL
from raydist.retrieval.index import unit_rows
from raydist.retrieval.trained import Trained, load_trained
from raydist.tasks import DataInfo

DEFAULT_TEMPLATE = "a photo of a {}."


def class_names(text: str) -> list[str]:
    """``CLASSNAMES``: a file of one class name a line (class 0 first), or the names separated by commas."""
    path = Path(text)
    names = path.read_text(encoding="utf-8").splitlines() if path.is_file() else text.split(",")
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise ValueError(f"--zero-shot {text}: no class names (a file of one name a line, or a,b,c)")
    return names


def zero_shot_classifier(trained: Trained, names: Sequence[str], templates: Sequence[str]) -> np.ndarray:
    """[K, D] unit rows: class k's row is ``normalize(mean_t normalize(text(template_t.format(name_k))))``
    (CLIP's prompt ensemble, as CLIP_benchmark builds it)."""
    if not templates or any("{}" not in t for t in templates):
        raise ValueError(f"--template {list(templates)}: each template needs a {{}} for the class name")
    texts = [t.format(name) for name in names for t in templates]
    emb = unit_rows(trained.task.embed_texts(trained.model, texts, trained.device).numpy())
    return unit_rows(emb.reshape(len(names), len(templates), -1).mean(axis=1))


def zero_shot_scores(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """CLIP_benchmark's figures of class scores [N, K] against true labels [N], as fractions: ``acc1``, ``acc5``
    (the label among the k best scores; k = min(5, K)) and ``mean_per_class_recall`` (the mean over the classes
    present of the share of their images ranked first)."""
    order = np.argsort(-logits, axis=1, kind="stable")
    top = {k: (order[:, : min(k, logits.shape[1])] == labels[:, None]).any(axis=1) for k in (1, 5)}
    present = np.unique(labels)
    per_class = [top[1][labels == c].mean() for c in present]
    return {
        "acc1": float(top[1].mean()),
        "acc5": float(top[5].mean()),
        "mean_per_class_recall": float(np.mean(per_class)),
    }


def zero_shot_eval(
    checkpoint: str | Path,
    data_dir: str | Path,
    names: Sequence[str],
    *,
    split: str = "test",
    templates: Sequence[str] = (DEFAULT_TEMPLATE,),
) -> dict[str, float]:
    """A ``pairs`` checkpoint classifying the images of a labelled dataset's ``split`` by their cosine to each
    class's prompts (:func:`zero_shot_classifier`; clean labels where the dataset has them):
    :func:`zero_shot_scores`. Encoded images go through the model's eval view; feature vectors must have the
    model's feature dim."""
    trained = load_trained(checkpoint, need_data=False)
    if trained.task.name != "pairs":
        raise ConfigError(
            f"--zero-shot: checkpoint {trained.checkpoint_path} is a {trained.task.name!r} model; it needs an image–caption (pairs) model"
        )
    data = DataInfo.from_dataset(data_dir)
    manifest = data.manifest
    if manifest.num_classes is None:
        raise ConfigError(f"--zero-shot: dataset {data_dir} has no class labels")
    if len(names) != manifest.num_classes:
        raise ConfigError(
            f"--zero-shot: {len(names)} class names for the {manifest.num_classes} classes of dataset {data_dir}"
        )
    if data.encoded != trained.data_info.encoded or (
        not data.encoded and manifest.feature_dim != trained.data_info.feature_dim
    ):
        model_input = (
            "encoded images" if trained.data_info.encoded else f"{trained.data_info.feature_dim}-d features"
        )
        data_input = "encoded images" if data.encoded else f"{manifest.feature_dim}-d features"
        raise ConfigError(
            f"--zero-shot: the model takes {model_input}, dataset {data_dir} holds {data_input}"
        )
    table = read_split(data_dir, split, verify=False, manifest=manifest)
    labels = table.column(CLEAN_LABEL if CLEAN_LABEL in table.column_names else LABEL).to_numpy()
    task, model, device = trained.task, trained.model, trained.device
    if data.encoded:
        channels = trained.data_info.image_channels or 3
        pixels = [decode_image(b, channels) for b in table.column(IMAGE).to_pylist()]
        images = task.embed_images(model, pixels, device)
    else:
        images = task.embed_features(model, feature_matrix(table.column(IMAGE)), device)
    logits = unit_rows(images.numpy()) @ zero_shot_classifier(trained, names, templates).T
    return zero_shot_scores(logits, labels)
