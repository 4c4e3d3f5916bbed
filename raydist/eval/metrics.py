"""Image–caption retrieval metrics with the VSE++ protocol (docs/algorithms.md#retrieval-metrics).

i2t: an image's rank is the best (smallest) 0-based rank among its captions; t2i: one query per
caption, ranked against all images. R@K = % of queries with rank < K; medr = floor(median) + 1;
meanr = mean + 1; rsum = the six recalls summed. ``folds=5`` averages over 5 consecutive image folds
(COCO 1K). Ranks count keys scoring strictly higher than the positive (ties resolve in the query's
favour) and are computed exactly with chunked matrix products.
"""

from __future__ import annotations

import math

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
) -> dict[str, float]:
    """VSE++ retrieval metrics; with ``folds>1`` the images are cut into consecutive equal folds
    (captions follow their image; with ``N % folds`` leftover images the last ones are not used, as
    in VSE++) and every metric is averaged over folds."""
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
        per_fold.append(m)
    return {k: float(np.mean([m[k] for m in per_fold])) for k in METRIC_KEYS}


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
    return "\n".join(lines)
