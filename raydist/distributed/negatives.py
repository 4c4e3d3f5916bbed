"""Cross-worker hard-negative mining: the global negative set, its random subsets, and the per-rank loss.

The loss maths is :func:`raydist.losses.ranking_terms`; this module only chooses rows and keys.

Row positions. Each of the W ranks holds ``m`` rows; global position of local row i on rank r is
``r·m + i`` (rank-major, the order of :func:`all_gather_with_grad`).

Negative set (thesis Fig. 3.6, "negative set size" n; the query count is ``batch_size`` = train.batch_size):

* queries: when ``batch_size < W·m`` each rank takes ``batch_size / W`` of its own rows; otherwise all rows.
* keys: when ``n < W·m`` a common random subset of n global positions, shared by every query; otherwise
  all W·m rows. A query's own positive pair is always scored (the positive is its own row, not a key), and
  keys with the query's image id are never negatives.

Draws (made identically on every rank, from the caller's ``generator``, which every rank seeds the same
way — the training loop uses ``torch.Generator().manual_seed(seed * 1_000_003 + global_step)``), in order:

1. only if ``batch_size < W·m``: for r = 0 … W−1, ``torch.randperm(m, generator)[:batch_size // W]`` —
   rank r's query rows (every rank makes all W draws and keeps its own, sorted);
2. only if ``n < W·m``: ``torch.randperm(W·m, generator)[:n]`` — the key positions (sorted).

With :func:`rows_per_worker` the loop fetches ``W·m = max(batch_size, n)`` rows, so at most one draw happens.

Loss scaling. Rank r returns ``W · reduce(L_r)``, where ``L_r`` sums its 2·(batch_size/W) query terms and
``reduce`` is the identity for "sum" and division by the global ``2·batch_size`` for "mean". Since the
gather's backward sums the key gradients back to the owners, after DDP averages gradients over the W
ranks the parameter gradients equal those of the single-process loss over all queries and the same keys;
for the values: ``(Σ_r returned_r) / W`` = the single-process loss (the mean over ranks of the logged
values is the global loss).

Local-only negatives (``loss.gather=False``): the same draws and scaling, but each query only sees the keys
its own rank holds (of the common subset, when there is one) — gradients of ``Σ_r`` of per-rank losses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from raydist.config import LossSection
from raydist.distributed.gather import all_gather_tensor, all_gather_with_grad, global_rank, world_size
from raydist.losses import RankingTerms, ranking_terms, reduce_queries


def rows_per_worker(batch_size: int, negative_set_size: int | None, world_size: int) -> int:
    """Rows each worker embeds per step: ``max(batch_size, negative_set_size) / W``.

    ``batch_size`` is the global query count; a negative set larger than it is embedded in full and the
    queries are a subset of it. Raises ValueError when the counts do not divide over the W workers.
    """
    rows = batch_size
    if negative_set_size is not None and negative_set_size > batch_size:
        rows = negative_set_size
    if batch_size % world_size or rows % world_size:
        raise ValueError(
            f"batch_size={batch_size} and rows per step={rows} must divide over {world_size} workers"
        )
    return rows // world_size


@dataclass(frozen=True)
class NegativeSet:
    """This rank's query rows (local positions) and the common key positions (global; None = all rows)."""

    query_rows: Tensor
    key_rows: Tensor | None


def sample_negative_set(
    rows: int,
    world: int,
    rank: int,
    *,
    batch_size: int | None,
    negative_set_size: int | None,
    generator: torch.Generator | None,
) -> NegativeSet:
    """Make this step's draws (module docstring, "Draws") and return rank ``rank``'s share."""
    total = rows * world
    batch_size = total if batch_size is None else batch_size
    if batch_size > total or batch_size % world:
        raise ValueError(f"batch_size={batch_size} queries cannot be split over {world} ranks of {rows} rows")
    draw_queries = batch_size < total
    draw_keys = negative_set_size is not None and negative_set_size < total
    if (draw_queries or draw_keys) and generator is None:
        raise ValueError("a negative-set subset needs a torch.Generator seeded identically on every rank")
    query_rows = torch.arange(rows)
    if draw_queries:
        per_rank = batch_size // world
        draws = [torch.randperm(rows, generator=generator)[:per_rank] for _ in range(world)]
        query_rows = draws[rank].sort().values
    key_rows = None
    if draw_keys:
        key_rows = torch.randperm(total, generator=generator)[:negative_set_size].sort().values
    return NegativeSet(query_rows=query_rows, key_rows=key_rows)


def negative_set_stats(
    terms: RankingTerms, query_pos: Tensor, key_pos: Tensor, rows: int, rank: int
) -> dict[str, float]:
    """Per-step statistics of this rank's queries (both directions).

    ``neg/remote_hardest_frac``: fraction of hardest negatives (highest-scoring negative key of each query
    with at least one negative) owned by another rank; ``neg/hardest_sim``: their mean score;
    ``neg/masked_pairs``: (query, key) pairs, both directions, not negatives although the key is not the
    query's own row (same image id); ``neg/keys``: keys in the negative set. Empty means are 0.
    """
    with torch.no_grad():
        negatives = terms.negatives
        remote = (key_pos // rows) != rank
        valid = negatives.any(1)
        sims, remote_flags = [], []
        for scores in (terms.image_query_scores, terms.caption_query_scores):
            if scores.shape[1] == 0:
                continue
            best, index = scores.masked_fill(~negatives, -torch.inf).max(1)
            sims.append(best[valid])
            remote_flags.append(remote[index][valid])
        sim = torch.cat(sims) if sims else torch.zeros(0)
        flags = torch.cat(remote_flags) if remote_flags else torch.zeros(0, dtype=torch.bool)
        same_image = ~negatives & (key_pos.unsqueeze(0) != query_pos.unsqueeze(1))
        return {
            "neg/remote_hardest_frac": float(flags.double().mean()) if flags.numel() else 0.0,
            "neg/hardest_sim": float(sim.double().mean()) if sim.numel() else 0.0,
            "neg/masked_pairs": float(2 * same_image.sum()),
            "neg/keys": float(key_pos.numel()),
        }


def _rank_ranking_loss(
    img: Tensor,
    cap: Tensor,
    *,
    image_ids: Tensor | None,
    sample_ids: Tensor | None,
    gather: bool,
    margin: float,
    hardest: bool,
    negative_set_size: int | None,
    batch_size: int | None,
    generator: torch.Generator | None,
    reduction: str,
    similarity: str,
    stats: dict[str, float] | None,
) -> Tensor:
    """This rank's scaled loss; ``gather=False`` keeps only keys of this rank (same draws and scaling)."""
    world, rank, rows = world_size(), global_rank(), img.shape[0]
    device = img.device
    plan = sample_negative_set(
        rows, world, rank, batch_size=batch_size, negative_set_size=negative_set_size, generator=generator
    )
    positions = torch.arange(rank * rows, (rank + 1) * rows, device=device)
    ids = image_ids if image_ids is not None else sample_ids
    ids = positions if ids is None else ids.to(device=device, dtype=torch.long)
    if gather:
        key_img, key_cap = all_gather_with_grad(img), all_gather_with_grad(cap)
        key_ids, key_pos = all_gather_tensor(ids), torch.arange(world * rows, device=device)
    else:
        key_img, key_cap, key_ids, key_pos = img, cap, ids, positions
    if plan.key_rows is not None:
        keep = torch.isin(key_pos, plan.key_rows.to(device))
        key_img, key_cap, key_ids, key_pos = key_img[keep], key_cap[keep], key_ids[keep], key_pos[keep]
    q = plan.query_rows.to(device)
    terms = ranking_terms(
        img[q],
        cap[q],
        key_img,
        key_cap,
        ids[q],
        key_ids,
        margin=margin,
        hardest=hardest,
        similarity=similarity,
    )
    if stats is not None:
        stats.update(negative_set_stats(terms, positions[q], key_pos, rows, rank))
    total = terms.image_queries.sum() + terms.caption_queries.sum()
    return world * reduce_queries(total, reduction, 2 * world * q.numel())


def cross_worker_ranking_loss(
    img: Tensor,
    cap: Tensor,
    *,
    image_ids: Tensor | None,
    margin: float = 0.2,
    hardest: bool = True,
    negative_set_size: int | None = None,
    generator: torch.Generator | None = None,
    reduction: str = "sum",
    similarity: str = "dot",
    sample_ids: Tensor | None = None,
    batch_size: int | None = None,
    stats: dict[str, float] | None = None,
) -> Tensor:
    """VSE++ ranking loss of this rank's queries against the global negative set (DESIGN.md §3 step 4).

    Call on every rank with that rank's m rows (the same m everywhere). Embeddings are gathered with
    autograd, ids without; pairs sharing an ``image_id`` are never negatives (without image ids, pairs
    sharing a ``sample_id``; without both, only a row's own pair). ``batch_size`` is the global query
    count (default W·m); ``negative_set_size``, draws and the returned scaling are in the module docstring:
    the mean over ranks of the returned values equals :func:`raydist.losses.ranking_loss` on the
    concatenated batch (with the same queries and keys), and so do the gradients after DDP averaging.
    """
    return _rank_ranking_loss(
        img,
        cap,
        image_ids=image_ids,
        sample_ids=sample_ids,
        gather=True,
        margin=margin,
        hardest=hardest,
        negative_set_size=negative_set_size,
        batch_size=batch_size,
        generator=generator,
        reduction=reduction,
        similarity=similarity,
        stats=stats,
    )


def step_ranking_loss(
    img: Tensor,
    cap: Tensor,
    *,
    image_ids: Tensor | None,
    sample_ids: Tensor | None = None,
    loss_cfg: LossSection,
    batch_size: int,
    hardest: bool,
    generator: torch.Generator | None = None,
    stats: dict[str, float] | None = None,
) -> Tensor:
    """The training step's loss from ``loss_cfg``: the one entry point the loop calls.

    ``loss.gather=True``: :func:`cross_worker_ranking_loss`. ``loss.gather=False``: the same draws and
    scaling but each query only sees keys on its own rank (no collective), i.e. gradients of the sum over
    ranks of per-rank losses. ``hardest`` overrides ``loss_cfg.hardest`` (SH warm-up). ``img`` must hold
    :func:`rows_per_worker` rows.
    """
    expected = rows_per_worker(batch_size, loss_cfg.negative_set_size, world_size())
    if img.shape[0] != expected:
        raise ValueError(
            f"got {img.shape[0]} rows on this worker, expected {expected} "
            f"(batch_size={batch_size}, negative_set_size={loss_cfg.negative_set_size}, W={world_size()})"
        )
    return _rank_ranking_loss(
        img,
        cap,
        image_ids=image_ids,
        sample_ids=sample_ids,
        gather=loss_cfg.gather,
        margin=loss_cfg.margin,
        hardest=hardest,
        negative_set_size=loss_cfg.negative_set_size,
        batch_size=batch_size,
        generator=generator,
        reduction=loss_cfg.reduction,
        similarity=loss_cfg.similarity,
        stats=stats,
    )
