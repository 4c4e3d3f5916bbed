"""What ``raydist search`` found, in words: each hit's dataset row (its split, an image's captions, a sample's
class) looked up by id in the indexed dataset, printed one line a hit or written as JSON for scripts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raydist.data import load_manifest, read_split
from raydist.data.schema import CAPTION, CAPTIONS, IMAGE_ID, LABEL, SAMPLE_ID

CAPTION_CHARS = 70  # a caption longer than this is cut in the text form (never in JSON)


@dataclass(frozen=True)
class DatasetRow:
    """One indexed item as the dataset holds it: its split, its captions (an image's, or a sample's when the
    labels dataset has any) and its class (labels: the label and, when the dataset names it, the class name)."""

    split: str
    captions: tuple[str, ...] = ()
    label: int | None = None
    class_name: str | None = None


def indexed_splits(meta: dict[str, Any]) -> list[str]:
    """The splits an index holds (``indexes.json``'s ``split``: one name, or ``train+val+test`` for ``all``)."""
    return str(meta["split"]).split("+")


def class_names(data_dir: str | Path) -> list[str] | None:
    """Names of classes 0, 1, … when the dataset records them (a converter's ``class_names`` or an ImageFolder's
    ``source.classes``), else None."""
    manifest = load_manifest(data_dir)
    names = manifest.class_names or manifest.source.get(
        "classes"
    )  # a generator may record a class count there
    return [str(n) for n in names] if isinstance(names, list) and names else None


def dataset_rows(data_dir: str | Path, task: str, splits: Sequence[str]) -> dict[int, DatasetRow]:
    """The rows of ``splits`` by the id an index keys them with (``image_id`` for pairs, one entry per image
    with all its captions in row order; ``sample_id`` otherwise)."""
    names = class_names(data_dir) if task != "pairs" else None
    rows: dict[int, DatasetRow] = {}
    for split in splits:
        table = read_split(data_dir, split, verify=False)
        columns = set(table.column_names)
        ids = table.column(IMAGE_ID if task == "pairs" else SAMPLE_ID).to_pylist()
        if CAPTIONS in columns:
            texts = [tuple(c) for c in table.column(CAPTIONS).to_pylist()]
        elif CAPTION in columns:
            texts = [(c,) for c in table.column(CAPTION).to_pylist()]
        else:
            texts = [()] * len(ids)
        labels = table.column(LABEL).to_pylist() if LABEL in columns else [None] * len(ids)
        for key, captions, label in zip(ids, texts, labels, strict=True):
            known = rows.get(key)
            if known is not None:  # pairs with features: one row per caption of the same image
                rows[key] = DatasetRow(split, known.captions + captions, known.label, known.class_name)
                continue
            name = names[label] if names is not None and label is not None and label < len(names) else None
            rows[key] = DatasetRow(split, captions, label, name)
    return rows


def hits(
    ids: np.ndarray, scores: np.ndarray, rows: dict[int, DatasetRow] | None
) -> list[list[dict[str, Any]]]:
    """Per query, its hits best first: rank, id, score and, when the dataset is at hand, what the row holds."""
    out = []
    for query_ids, query_scores in zip(ids, scores, strict=True):
        found = []
        for rank, (i, score) in enumerate(zip(query_ids, query_scores, strict=True), 1):
            hit: dict[str, Any] = {"rank": rank, "id": int(i), "score": round(float(score), 6)}
            row = rows.get(int(i)) if rows is not None else None
            if row is not None:
                hit["split"] = row.split
                if row.captions:
                    hit["captions"] = list(row.captions)
                if row.label is not None:
                    hit["label"] = int(row.label)
                if row.class_name is not None:
                    hit["class"] = row.class_name
            found.append(hit)
        out.append(found)
    return out


def _short(text: str) -> str:
    return text if len(text) <= CAPTION_CHARS else text[: CAPTION_CHARS - 1] + "…"


def hit_line(hit: dict[str, Any]) -> str:
    """``RANK  id ID  score S  SPLIT  "first caption" (+n more)  class C 'name'``: the parts the hit has."""
    parts = [f"  {hit['rank']:>3}  id {hit['id']:>10}  score {hit['score']:.4f}"]
    if "split" in hit:
        parts.append(f"{hit['split']:<5}")
    if "label" in hit:
        named = f" {hit['class']!r}" if "class" in hit and hit["class"] != str(hit["label"]) else ""
        parts.append(f"class {hit['label']}{named}")
    captions = hit.get("captions", [])
    if captions:
        more = f" (+{len(captions) - 1} more)" if len(captions) > 1 else ""
        parts.append(json.dumps(_short(captions[0]), ensure_ascii=False) + more)
    return "  ".join(parts)


def search_report(
    queries: Sequence[str] | np.ndarray,
    found: list[list[dict[str, Any]]],
    *,
    index: str,
    meta: dict[str, Any],
    dim: int,
    checkpoint: str,
    data_dir: str | None,
) -> dict[str, Any]:
    """The JSON form of a search (``raydist search --json``): the index, what embedded the queries, the dataset
    the hits were looked up in (None: ids only) and each query with its hits."""
    texts = not isinstance(queries, np.ndarray)
    return {
        "index": index,
        "task": meta["task"],
        "split": meta["split"],
        "dim": dim,
        "checkpoint": checkpoint,
        "dataset": data_dir,
        "queries": [
            {"query": str(queries[q]) if texts else q, "hits": query_hits}
            for q, query_hits in enumerate(found)
        ],
    }
