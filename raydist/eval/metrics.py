"""Image–caption retrieval metrics with the VSE++ protocol (docs/algorithms.md#retrieval-metrics).

i2t: an image's rank is the best (smallest) 0-based rank among its captions; t2i: one query per
caption, ranked against all images. R@K = % of queries with rank < K; medr = floor(median) + 1;
meanr = mean + 1; rsum = the six recalls summed. ``folds=5`` averages over 5 consecutive image folds
(COCO 1K). Ranks count keys scoring strictly higher than the positive (ties resolve in the query's
favour) and are computed exactly with chunked matrix products.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

METRIC_KEYS = (
    "i2t_r1",
    "i2t_r5",
    "i2t_r10",
    "i2t_medr",
    "i2t_meanr",
    "t2i_r1",
    "t2i_r5",
    "t2i_r10",
    "t2i_medr",
    "t2i_meanr",
    "rsum",
)


def _as_tensor(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(x)
    return t.double() if t.dtype == torch.float64 else t.float()


def retrieval_ranks(
    img_emb: np.ndarray | torch.Tensor,
    cap_emb: np.ndarray | torch.Tensor,
    cap_to_img: np.ndarray | torch.Tensor,
    *,
    chunk: int = 1024,
) -> tuple[np.ndarray, np.ndarray]:
    """0-based ranks: (i2t best rank per image [N_img], t2i rank per caption [N_cap]).

    Score = dot product. Every image must have at least one caption.
    """
    img = _as_tensor(img_emb)
    cap = _as_tensor(cap_emb).to(img.dtype)
    owner = torch.as_tensor(np.asarray(cap_to_img), dtype=torch.long)
    n_img, n_cap = img.shape[0], cap.shape[0]
    if owner.shape != (n_cap,):
        raise ValueError(f"cap_to_img has shape {tuple(owner.shape)}, expected ({n_cap},)")
    if n_cap and (owner.min() < 0 or owner.max() >= n_img):
        raise ValueError(f"cap_to_img values must lie in [0, {n_img})")
    counts = torch.bincount(owner, minlength=n_img)
    if (counts == 0).any():
        missing = torch.nonzero(counts == 0).flatten()[:10].tolist()
        raise ValueError(f"images without captions (rows {missing}): i2t rank is undefined")
    t2i = torch.empty(n_cap, dtype=torch.long)
    for s in range(0, n_cap, chunk):
        scores = cap[s : s + chunk] @ img.T  # [c, N_img]
        pos = scores.gather(1, owner[s : s + chunk, None])
        t2i[s : s + chunk] = (scores > pos).sum(1)
    i2t = torch.empty(n_img, dtype=torch.long)
    for s in range(0, n_img, chunk):
        scores = img[s : s + chunk] @ cap.T  # [i, N_cap]
        own = owner[None, :] == torch.arange(s, min(s + chunk, n_img))[:, None]
        best_pos = scores.masked_fill(~own, -math.inf).max(1, keepdim=True).values
        i2t[s : s + chunk] = (scores > best_pos).sum(1)
    return i2t.numpy(), t2i.numpy()


CAPTION_LEVEL_KEYS = ("i2t_cap_r1", "i2t_cap_r5", "i2t_cap_r10", "t2i_cap_r1", "t2i_cap_r5", "t2i_cap_r10")


def caption_groups(captions: Sequence[str]) -> np.ndarray:
    """A group id per caption: captions with the same words (case and spacing ignored) share one."""
    keys = np.array([" ".join(str(c).lower().split()) for c in captions], dtype=object)
    return np.unique(keys, return_inverse=True)[1].reshape(-1) if len(keys) else np.zeros(0, np.int64)


def shared_caption_pairs(cap_to_img: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (caption, image) pairs that count as a hit at caption level: the image owns a caption of the
    caption's group (its own image always does)."""
    owner = np.asarray(cap_to_img, dtype=np.int64)
    images_of: dict[int, list[int]] = {}
    for g, images in zip(
        *np.unique(np.stack([groups, owner]), axis=1), strict=False
    ):  # sorted (group, image) pairs
        images_of.setdefault(int(g), []).append(int(images))
    caps, imgs = [], []
    for c, g in enumerate(groups):
        members = images_of[int(g)]
        caps.append(np.full(len(members), c))
        imgs.append(np.asarray(members))
    return np.concatenate(caps), np.concatenate(imgs)


def positive_ranks(
    img_emb: np.ndarray | torch.Tensor,
    cap_emb: np.ndarray | torch.Tensor,
    pairs: tuple[np.ndarray, np.ndarray],
    *,
    chunk: int = 1024,
) -> tuple[np.ndarray, np.ndarray]:
    """0-based ranks when several keys count as a hit: ``pairs`` = (caption rows, image rows) that match.
    i2t: keys (captions) scoring strictly higher than the image's best-scoring matching caption; t2i: images
    scoring strictly higher than the caption's best-scoring matching image."""
    img, cap = _as_tensor(img_emb), _as_tensor(cap_emb)
    cap = cap.to(img.dtype)
    caps, imgs = (torch.as_tensor(np.asarray(a), dtype=torch.long) for a in pairs)
    n_img, n_cap = img.shape[0], cap.shape[0]
    t2i, i2t = torch.empty(n_cap, dtype=torch.long), torch.empty(n_img, dtype=torch.long)
    for rows, keys, out, (q, k) in ((cap, img, t2i, (caps, imgs)), (img, cap, i2t, (imgs, caps))):
        for s in range(0, rows.shape[0], chunk):
            scores = rows[s : s + chunk] @ keys.T
            inside = (q >= s) & (q < s + scores.shape[0])
            hit = torch.zeros(scores.shape, dtype=torch.bool)
            hit[q[inside] - s, k[inside]] = True
            best = scores.masked_fill(~hit, -math.inf).max(1, keepdim=True).values
            out[s : s + scores.shape[0]] = (scores > best).sum(1)
    return i2t.numpy(), t2i.numpy()


def exact_ceiling(cap_to_img: np.ndarray, groups: np.ndarray, ks: Sequence[int] = (1, 5, 10)) -> float:
    """The highest rsum the exact-image protocol allows when captions repeat: captions of one group embed
    alike, so their queries share one image ranking and at most K of the group's images are in its top K --
    t2i R@K ≤ Σ over groups of the K largest per-image caption counts / captions. i2t is not limited
    (captions that tie with the image's own do not count against it): 300 + Σ_K t2i bounds."""
    owner = np.asarray(cap_to_img, dtype=np.int64)
    pairs, counts = np.unique(np.stack([groups, owner]), axis=1, return_counts=True)
    total = 0.0
    for k in ks:
        best = 0
        for g in np.unique(pairs[0]):
            best += int(np.sort(counts[pairs[0] == g])[::-1][:k].sum())
        total += 100.0 * best / len(owner)
    return 300.0 + total


def _summary(ranks: np.ndarray, prefix: str) -> dict[str, float]:
    return {
        f"{prefix}_r1": 100.0 * float(np.mean(ranks < 1)),
        f"{prefix}_r5": 100.0 * float(np.mean(ranks < 5)),
        f"{prefix}_r10": 100.0 * float(np.mean(ranks < 10)),
        f"{prefix}_medr": float(math.floor(np.median(ranks)) + 1),
        f"{prefix}_meanr": float(ranks.mean() + 1),
    }


def retrieval_metrics(
    img_emb: np.ndarray | torch.Tensor,
    cap_emb: np.ndarray | torch.Tensor,
    cap_to_img: np.ndarray | torch.Tensor,
    *,
    folds: int = 1,
    captions: Sequence[str] | None = None,
) -> dict[str, float]:
    """VSE++ retrieval metrics; with ``folds>1`` the images are cut into consecutive equal folds
    (captions follow their image; with ``N % folds`` leftover images the last ones are not used, as
    in VSE++) and every metric is averaged over folds. With the caption texts (``captions``, one per
    caption row) and a caption text that belongs to more than one image, also caption-level recalls
    (:data:`CAPTION_LEVEL_KEYS`: any image with the query's caption counts, :func:`positive_ranks`),
    their ``cap_rsum``, and ``rsum_ceiling``, the best rsum the exact protocol allows (:func:`exact_ceiling`)."""
    img = _as_tensor(img_emb)
    cap = _as_tensor(cap_emb)
    owner = np.asarray(cap_to_img, dtype=np.int64)
    n_img = img.shape[0]
    if folds < 1 or n_img < folds:
        raise ValueError(f"folds={folds} needs 1 <= folds <= number of images ({n_img})")
    size = n_img // folds
    per_fold = []
    for f in range(folds):
        lo, hi = f * size, (f + 1) * size
        sel = np.nonzero((owner >= lo) & (owner < hi))[0]
        i2t, t2i = retrieval_ranks(img[lo:hi], cap[sel], owner[sel] - lo)
        m = {**_summary(i2t, "i2t"), **_summary(t2i, "t2i")}
        m["rsum"] = sum(m[k] for k in ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10"))
        groups = None if captions is None else caption_groups([captions[c] for c in sel])
        if groups is not None and len(np.unique(np.stack([groups, owner[sel]]), axis=1)[0]) > len(
            np.unique(groups)
        ):  # some caption text belongs to several images
            i2t, t2i = positive_ranks(img[lo:hi], cap[sel], shared_caption_pairs(owner[sel] - lo, groups))
            level = {**_summary(i2t, "i2t"), **_summary(t2i, "t2i")}
            m.update({k: level[k.replace("_cap_r", "_r")] for k in CAPTION_LEVEL_KEYS})
            m["cap_rsum"] = sum(m[k] for k in CAPTION_LEVEL_KEYS)
            m["rsum_ceiling"] = exact_ceiling(owner[sel] - lo, groups)
        per_fold.append(m)
    keys = [*METRIC_KEYS, *(k for k in per_fold[0] if k not in METRIC_KEYS and all(k in m for m in per_fold))]
    return {k: float(np.mean([m[k] for m in per_fold])) for k in keys}


def format_metrics(metrics: dict[str, float]) -> str:
    """A small text table: rows i2t / t2i, columns R@1 R@5 R@10 medr meanr, then rsum (retrieval
    metrics); other metrics (e.g. a labelled set's) one ``name value`` line each."""
    if "rsum" not in metrics:
        return "\n".join(f"{k:8}{v:8.2f}" for k, v in metrics.items())
    lines = [f"{'':6}{'R@1':>8}{'R@5':>8}{'R@10':>8}{'medr':>8}{'meanr':>9}"]
    for d in ("i2t", "t2i"):
        lines.append(
            f"{d:6}{metrics[f'{d}_r1']:8.1f}{metrics[f'{d}_r5']:8.1f}{metrics[f'{d}_r10']:8.1f}"
            f"{metrics[f'{d}_medr']:8.1f}{metrics[f'{d}_meanr']:9.1f}"
        )
    lines.append(f"rsum  {metrics['rsum']:8.1f}")
    if "cap_rsum" in metrics:
        lines.append(
            f"captions repeat over images: the exact rsum can reach at most {metrics['rsum_ceiling']:.1f}; "
            "caption-level (any image with the query's caption counts):"
        )
        for d in ("i2t", "t2i"):
            lines.append(
                f"{d + '*':6}{metrics[f'{d}_cap_r1']:8.1f}{metrics[f'{d}_cap_r5']:8.1f}{metrics[f'{d}_cap_r10']:8.1f}"
            )
        lines.append(f"rsum* {metrics['cap_rsum']:8.1f}")
    return "\n".join(lines)
