"""The cross-worker ranking loss: VSE++'s bidirectional hinge ranking loss over negatives mined from the global
batch of all workers (what ``loss.kind=ranking``, :mod:`raydist.losses.kinds.ranking`, computes), and its
entry points for a DDP loop of one's own.

The loss maths is :func:`raydist.losses.mined_ranking_terms`; the rows and keys are the step's negative set
(:mod:`raydist.distributed.negatives`: row positions, the negative set, its draws). The pairs task calls
:func:`rank_ranking_loss` (through the ranking loss kind) on its gathered batch;
:func:`cross_worker_ranking_loss` (explicit arguments) and :func:`step_ranking_loss` (from a loss section) are
the public one-call entry points.

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

from collections.abc import Mapping

import torch
from pydantic import BaseModel
from torch import Tensor

from raydist.config import LossSectionBase
from raydist.distributed import (
    GatheredBatch,
    NegativeSet,
    StepPlan,
    gather_step,
    global_rank,
    sample_negative_set,
    world_size,
)
from raydist.losses.miners import HardestNegatives, RankingInputs
from raydist.losses.ranking import mined_ranking_terms
from raydist.losses.reducers import reduce_queries, scale_for_world


def negative_set_stats(mined: HardestNegatives, key_pos: Tensor, rows: int, rank: int) -> dict[str, float]:
    """Per-step statistics of this rank's queries (both directions), from the miner's pass.

    ``neg/remote_hardest_frac``: fraction of hardest negatives (highest-scoring negative key of each query
    with at least one negative) owned by another rank; ``neg/hardest_sim``: their mean score;
    ``neg/masked_pairs``: (query, key) pairs, both directions, not negatives although the key is not the
    query's own row (same image id); ``neg/keys``: keys in the negative set. Empty means are 0.
    """
    keys = torch.cat([mined.image_query_key, mined.caption_query_key])
    sims = torch.cat([mined.image_query_score, mined.caption_query_score])
    valid = keys >= 0
    remote = (key_pos[keys[valid]] // rows) != rank
    return {
        "neg/remote_hardest_frac": float(remote.double().mean()) if remote.numel() else 0.0,
        "neg/hardest_sim": float(sims[valid].double().mean()) if valid.any() else 0.0,
        "neg/masked_pairs": float(mined.masked_pairs),
        "neg/keys": float(key_pos.numel()),
    }


def rank_ranking_loss(
    batch: GatheredBatch,
    negative_set: NegativeSet,
    *,
    ids: str,
    margin: float,
    hardest: bool,
    reduction: str = "sum",
    similarity: str = "dot",
    tile: int = 4096,
    stats: dict[str, float] | None = None,
    memory: Mapping[str, Tensor] | None = None,
) -> Tensor:
    """This rank's scaled ranking loss on a gathered batch (embeddings ``img``/``cap``, ids ``ids``): its
    queries of ``negative_set`` against the common keys; scaling in the module docstring. ``stats`` gets
    :func:`negative_set_stats` and ``neg/queries``, the queries of all ranks (the global batch this step
    scored: every rank has as many). ``memory``: the loss memory's rows (``img``, ``cap``, ``ids``; no graph),
    extra keys of every query in both directions, a row sharing the query's id never its negative; their
    positions are negative (never a query's own row)."""
    img, cap, own_ids = batch.local["img"], batch.local["cap"], batch.local[ids]
    key_img, key_cap, key_ids, key_pos = (
        batch.keys["img"],
        batch.keys["cap"],
        batch.keys[ids],
        batch.key_positions,
    )
    if negative_set.key_rows is not None:
        keep = torch.isin(key_pos, negative_set.key_rows.to(key_pos.device))
        key_img, key_cap, key_ids, key_pos = key_img[keep], key_cap[keep], key_ids[keep], key_pos[keep]
    if memory is not None:
        key_img, key_cap = torch.cat([key_img, memory["img"]]), torch.cat([key_cap, memory["cap"]])
        key_ids = torch.cat([key_ids, memory[ids]])
        key_pos = torch.cat([key_pos, -1 - torch.arange(memory[ids].shape[0], device=key_pos.device)])
    q = negative_set.query_rows.to(img.device)
    if q.numel() != batch.rows:  # a query subset (the negative set is larger than the query batch)
        img, cap, own_ids = img[q], cap[q], own_ids[q]
    inputs = RankingInputs(img, cap, key_img, key_cap, own_ids, key_ids, batch.positions[q], key_pos)
    image_terms, caption_terms, mined = mined_ranking_terms(
        inputs, margin=margin, hardest=hardest, similarity=similarity, tile=tile
    )
    if stats is not None:
        stats.update(negative_set_stats(mined, key_pos, batch.rows, batch.rank))
        stats["neg/queries"] = float(batch.world * q.numel())
    total = image_terms.sum() + caption_terms.sum()
    return scale_for_world(reduce_queries(total, reduction, 2 * batch.world * q.numel()), batch.world)


def ranking_ids(
    image_ids: Tensor | None, sample_ids: Tensor | None, rows: int, device: torch.device
) -> Tensor:
    """The ids that decide negatives: image ids, else sample ids, else global row positions."""
    ids = image_ids if image_ids is not None else sample_ids
    if ids is None:
        start = global_rank() * rows
        return torch.arange(start, start + rows, device=device)
    return ids.to(device=device, dtype=torch.long)


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
    """VSE++ ranking loss of this rank's queries against the global negative set (gather, draw, loss).

    Call on every rank with that rank's m rows (the same m everywhere). Embeddings are gathered with
    autograd, ids without; pairs sharing an ``image_id`` are never negatives (without image ids, pairs
    sharing a ``sample_id``; without both, only a row's own pair). ``batch_size`` is the global query
    count (default W·m); ``negative_set_size``, draws and the returned scaling are in the module docstring:
    the mean over ranks of the returned values equals :func:`raydist.losses.ranking_loss` on the
    concatenated batch (with the same queries and keys), and so do the gradients after DDP averaging.
    """
    rows = img.shape[0]
    ids = ranking_ids(image_ids, sample_ids, rows, img.device)
    batch = gather_step({"img": img, "cap": cap}, {"ids": ids})
    negative_set = sample_negative_set(
        rows,
        batch.world,
        batch.rank,
        batch_size=batch_size,
        negative_set_size=negative_set_size,
        generator=generator,
    )
    return rank_ranking_loss(
        batch,
        negative_set,
        ids="ids",
        margin=margin,
        hardest=hardest,
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
    loss_cfg: LossSectionBase | BaseModel,
    batch_size: int,
    hardest: bool,
    generator: torch.Generator | None = None,
    stats: dict[str, float] | None = None,
) -> Tensor:
    """The ranking loss a training step computes from ``loss_cfg`` (a config's loss section, or
    :class:`raydist.losses.kinds.ranking.RankingOptions`): gather (``loss.gather``), draw, loss.

    ``loss.gather=False``: the same draws and scaling but each query only sees keys on its own rank (no
    collective), i.e. gradients of the sum over ranks of per-rank losses. ``hardest`` overrides
    ``loss_cfg.hardest`` (SH warm-up). ``img`` must hold :attr:`StepPlan.rows_per_worker` rows.
    """
    plan = StepPlan(batch_size, loss_cfg.negative_set_size, world_size())
    if img.shape[0] != plan.rows_per_worker:
        raise ValueError(
            f"got {img.shape[0]} rows on this worker, expected {plan.rows_per_worker} "
            f"(batch_size={batch_size}, negative_set_size={loss_cfg.negative_set_size}, W={plan.world})"
        )
    ids = ranking_ids(image_ids, sample_ids, img.shape[0], img.device)
    batch = gather_step({"img": img, "cap": cap}, {"ids": ids}, enabled=loss_cfg.gather)
    return rank_ranking_loss(
        batch,
        plan.draw(batch.rank, generator),
        ids="ids",
        margin=loss_cfg.margin,
        hardest=hardest,
        reduction=loss_cfg.reduction,
        similarity=loss_cfg.similarity,
        tile=loss_cfg.tile,
        stats=stats,
    )
