"""Cross-worker ranking loss under DDP (2 gloo processes) vs single-process references on the global batch.

One spawn of 2 workers runs every case and saves per-rank losses, parameter gradients and stats; the
references are computed here with :func:`raydist.losses.ranking_loss` or the brute-force loop of
test_losses_ranking, with subsets redrawn from the documented seeding (raydist/distributed/negatives.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_losses_ranking import brute_force_loss
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from raydist.config import LossSection
from raydist.distributed import all_gather_tensor, gather_step, rows_per_worker, sample_negative_set
from raydist.distributed.spawn import spawn
from raydist.losses import (
    RankingInputs,
    cross_worker_ranking_loss,
    l2_normalize,
    rank_ranking_loss,
    ranking_loss,
    ranking_terms,
    step_ranking_loss,
)

WORLD = 2
FEATURES, VOCAB, DIM, TOKENS = 6, 20, 5, 3


class TinyVSE(nn.Module):
    """Linear image projection + mean EmbeddingBag captions, both L2-normalised (float64)."""

    def __init__(self) -> None:
        super().__init__()
        self.img = nn.Linear(FEATURES, DIM, dtype=torch.float64)
        self.txt = nn.EmbeddingBag(VOCAB, DIM, mode="mean", dtype=torch.float64)

    def forward(self, features: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return l2_normalize(self.img(features)), l2_normalize(self.txt(tokens))


def _bank(model: TinyVSE) -> dict[str, torch.Tensor]:
    """18 rows: images 0..15 with one caption each; rows 16 and 17 are other captions of images 1 and 2.

    Image 1's features are solved so that ``f(I_1) = g(C_16)``: under MH the unmasked duplicate (its own
    other caption, score 1) would be image query 1's hardest negative with a non-zero gradient.
    """
    g = torch.Generator().manual_seed(5)
    features = torch.randn(16, FEATURES, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, VOCAB, (18, TOKENS), generator=g)
    with torch.no_grad():
        target = model.txt(tokens[16:17])[0] * 3.0 - model.img.bias
        features[1] = torch.linalg.lstsq(model.img.weight, target).solution
    image_ids = torch.cat([torch.arange(16), torch.tensor([1, 2])])
    return {
        "features": features[image_ids],
        "tokens": tokens,
        "image_ids": image_ids,
        "sample_ids": torch.arange(100, 118),
    }


UNIQUE = list(range(8))
DUP_LOCAL = [0, 1, 16, 3, 4, 5, 6, 7]  # image 1 twice on rank 0
DUP_REMOTE = [0, 1, 2, 3, 4, 16, 6, 7]  # image 1 at global rows 1 (rank 0) and 5 (rank 1)
LARGER = [0, 1, 2, 3, 4, 5, 6, 7, 16, 9, 10, 11, 12, 13, 14, 15]  # image 1 at rows 1 (rank 0), 8 (rank 1)


@dataclass
class Case:
    """One distributed run: bank rows (rank r holds the r-th contiguous block) and how the loss is called."""

    rows: list[int]
    hardest: bool = True
    # "cross": cross_worker_ranking_loss; "step": step_ranking_loss; "nograd": the broken gather below
    via: str = "cross"
    loss: dict = field(default_factory=dict)  # LossSection fields for "step"; kwargs for "cross"
    batch_size: int = 8
    seed: int = 0


CASES = {
    "mh": Case(UNIQUE),
    "sh": Case(UNIQUE, hardest=False),
    "mh_dup_local": Case(DUP_LOCAL),
    "mh_dup_remote": Case(DUP_REMOTE),
    "sh_dup_remote": Case(DUP_REMOTE, hardest=False),
    "sh_mean_order": Case(
        DUP_REMOTE, hardest=False, via="step", loss={"reduction": "mean", "similarity": "order"}
    ),
    "subset": Case(DUP_REMOTE, via="step", loss={"negative_set_size": 3}, seed=11),
    "equal": Case(DUP_REMOTE, via="step", loss={"negative_set_size": 8}, seed=11),
    "larger": Case(LARGER, via="step", loss={"negative_set_size": 16}, seed=12),
    "local": Case(DUP_REMOTE, via="step", loss={"gather": False}),
    "nograd": Case(UNIQUE, via="nograd"),
    "nested": Case(DUP_REMOTE, via="nested"),
}
NESTING = (2, 5)  # Matryoshka prefixes of the 5-d embeddings (DIM = 5)


def _naive_gather_loss(img: torch.Tensor, cap: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The classic bug: keys gathered without autograd (own slice re-inserted with grad), local queries."""
    rank, rows = dist.get_rank(), img.shape[0]
    own = slice(rank * rows, (rank + 1) * rows)
    key_img, key_cap = all_gather_tensor(img).clone(), all_gather_tensor(cap).clone()
    key_img[own], key_cap[own] = img, cap
    inputs = RankingInputs(img, cap, key_img, key_cap, ids, all_gather_tensor(ids))
    terms = ranking_terms(inputs, margin=0.2, hardest=True)
    return WORLD * (terms.image_queries.sum() + terms.caption_queries.sum())


def _case_loss(case: Case, img: torch.Tensor, cap: torch.Tensor, batch: dict, stats: dict) -> torch.Tensor:
    generator = torch.Generator().manual_seed(case.seed)
    if case.via == "nograd":
        return _naive_gather_loss(img, cap, batch["image_ids"])
    if case.via == "nested":  # one gather, every prefix sliced from it
        gathered = gather_step({"img": img, "cap": cap}, {"ids": batch["image_ids"]})
        negative_set = sample_negative_set(
            img.shape[0], WORLD, dist.get_rank(), batch_size=None, negative_set_size=None, generator=None
        )
        return sum(
            rank_ranking_loss(
                gathered.view(lambda z, m=m: l2_normalize(z[:, :m]), ("img", "cap")),
                negative_set,
                ids="ids",
                margin=0.2,
                hardest=True,
            )
            for m in NESTING
        )
    if case.via == "cross":
        return cross_worker_ranking_loss(
            img, cap, image_ids=batch["image_ids"], hardest=case.hardest, generator=generator, stats=stats
        )
    return step_ranking_loss(
        img,
        cap,
        image_ids=batch["image_ids"],
        sample_ids=batch["sample_ids"],
        loss_cfg=LossSection(**case.loss),
        batch_size=case.batch_size,
        hardest=case.hardest,
        generator=generator,
        stats=stats,
    )


def _worker(rank: int, init_file: str, state: dict, bank: dict, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    model = TinyVSE()
    model.load_state_dict(state)
    ddp = DistributedDataParallel(model)
    results = {}
    for name, case in CASES.items():
        rows = len(case.rows) // WORLD
        mine = case.rows[rank * rows : (rank + 1) * rows]
        batch = {k: v[mine] for k, v in bank.items()}
        ddp.zero_grad(set_to_none=True)
        img, cap = ddp(batch["features"], batch["tokens"])
        stats: dict[str, float] = {}
        loss = _case_loss(case, img, cap, batch, stats)
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        results[name] = {"loss": loss.item(), "grads": grads, "stats": stats}
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Spawn the 2 workers once; return the bank, the model and each rank's results."""
    out = tmp_path_factory.mktemp("ddp")
    torch.manual_seed(0)
    model = TinyVSE()
    bank = _bank(model)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spawn(_worker, (str(out / "init"), model.state_dict(), bank, str(out)), nprocs=WORLD)
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]
    return {"bank": bank, "model": model, "ranks": ranks}


def _embed(model: TinyVSE, bank: dict, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    img, cap = model(bank["features"][rows], bank["tokens"][rows])
    return img, cap, bank["image_ids"][rows].tolist()


def _grads(model: TinyVSE, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    names, params = zip(*model.named_parameters(), strict=False)
    return dict(zip(names, torch.autograd.grad(loss, params), strict=False))


def _subset_draws(case: Case) -> tuple[list[int] | None, list[int] | None]:
    """Queries and keys (global rows) redrawn here from the documented order of draws."""
    g = torch.Generator().manual_seed(case.seed)
    total, n = len(case.rows), case.loss.get("negative_set_size")
    rows, queries, keys = total // WORLD, None, None
    if case.batch_size < total:
        per_rank = case.batch_size // WORLD
        queries = [
            r * rows + i
            for r in range(WORLD)
            for i in sorted(torch.randperm(rows, generator=g)[:per_rank].tolist())
        ]
    if n is not None and n < total:
        keys = sorted(torch.randperm(total, generator=g)[:n].tolist())
    return queries, keys


def reference(name: str, model: TinyVSE, bank: dict, *, ids_override: list[int] | None = None) -> tuple:
    """Single-process loss and parameter gradients of case ``name`` on its concatenated global batch."""
    case = CASES[name]
    img, cap, ids = _embed(model, bank, case.rows)
    ids = ids if ids_override is None else ids_override
    cfg = LossSection(**case.loss)
    if case.via == "step" and not cfg.gather:
        half = len(case.rows) // WORLD
        loss = sum(
            dense_loss(img[s], cap[s], hardest=case.hardest, image_ids=torch.tensor(ids[s]))
            for s in (slice(0, half), slice(half, None))
        )
    elif case.via == "nested":
        loss = sum(
            dense_loss(l2_normalize(img[:, :m]), l2_normalize(cap[:, :m]), image_ids=torch.tensor(ids))
            for m in NESTING
        )
    elif case.via == "step" and cfg.negative_set_size is not None:
        queries, keys = _subset_draws(case)
        loss = brute_force_loss(
            img, cap, ids, margin=cfg.margin, hardest=case.hardest, queries=queries, keys=keys
        )
    else:
        loss = dense_loss(
            img,
            cap,
            margin=cfg.margin,
            hardest=case.hardest,
            image_ids=torch.tensor(ids),
            reduction=cfg.reduction,
            similarity=cfg.similarity,
        )
    return loss, _grads(model, loss)


def dense_loss(img, cap, *, margin=0.2, hardest=True, image_ids=None, reduction="sum", similarity="dot"):
    """The dense reference: every [N, N] score and hinge cost materialised (no miner)."""
    ids = torch.arange(img.shape[0]) if image_ids is None else image_ids
    terms = ranking_terms(
        RankingInputs.batch(img, cap, ids), margin=margin, hardest=hardest, similarity=similarity
    )
    total = terms.image_queries.sum() + terms.caption_queries.sum()
    return total / (2 * img.shape[0]) if reduction == "mean" else total


def _assert_grads_close(got: dict, want: dict) -> None:
    for n, expected in want.items():
        torch.testing.assert_close(got[n], expected, rtol=1e-9, atol=1e-12, msg=lambda m, n=n: f"{n}: {m}")


def _relative_gap(got: dict, want: dict) -> float:
    num = sum(float((got[n] - want[n]).norm() ** 2) for n in want) ** 0.5
    return num / sum(float(want[n].norm() ** 2) for n in want) ** 0.5


CORRECT = [n for n in CASES if n != "nograd"]


@pytest.mark.slow
@pytest.mark.gloo
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", CORRECT)
def test_ddp_gradients_match_single_process(runs: dict, name: str) -> None:
    ranks = [r[name] for r in runs["ranks"]]
    loss, want = reference(name, runs["model"], runs["bank"])
    assert loss > 0
    _assert_grads_close(ranks[1]["grads"], ranks[0]["grads"])
    _assert_grads_close(ranks[0]["grads"], want)
    # documented relation: the mean over ranks of the returned values is the single-process loss
    assert sum(r["loss"] for r in ranks) / WORLD == pytest.approx(loss.item(), rel=1e-12)


@pytest.mark.slow
@pytest.mark.gloo
@pytest.mark.timeout(120)
def test_forgetting_the_gather_fails_the_comparison(runs: dict) -> None:
    model, bank = runs["model"], runs["bank"]
    _, want = reference("mh", model, bank)
    assert _relative_gap(runs["ranks"][0]["nograd"]["grads"], want) > 1e-3
    _, global_dup = reference("mh_dup_remote", model, bank)
    assert _relative_gap(runs["ranks"][0]["local"]["grads"], global_dup) > 1e-3


@pytest.mark.slow
@pytest.mark.gloo
@pytest.mark.timeout(120)
def test_the_comparisons_see_masks_and_subsets(runs: dict) -> None:
    """References with the cross-worker duplicate unmasked, or another key subset, give other gradients."""
    model, bank = runs["model"], runs["bank"]
    _, masked = reference("mh_dup_remote", model, bank)
    _, unmasked = reference("mh_dup_remote", model, bank, ids_override=list(range(8)))
    assert _relative_gap(unmasked, masked) > 1e-3
    _, subset = reference("subset", model, bank)
    _, full = reference("equal", model, bank)
    assert _relative_gap(subset, full) > 1e-3
    queries, keys = _subset_draws(CASES["subset"])
    assert queries is None and len(keys) == 3
    assert _subset_draws(CASES["larger"])[1] is None


@pytest.mark.slow
@pytest.mark.gloo
@pytest.mark.timeout(120)
def test_stats(runs: dict) -> None:
    model, bank = runs["model"], runs["bank"]
    for rank, res in enumerate(runs["ranks"]):
        assert res["mh_dup_remote"]["stats"]["neg/masked_pairs"] == 2.0  # one cross-worker pair, 2 directions
        assert res["mh"]["stats"]["neg/masked_pairs"] == 0.0
        assert res["mh"]["stats"]["neg/keys"] == 8.0
        assert res["subset"]["stats"]["neg/keys"] == 3.0
        assert res["larger"]["stats"]["neg/keys"] == 16.0
        assert res["local"]["stats"]["neg/remote_hardest_frac"] == 0.0
        # hardest negatives of this rank's 8 queries, recomputed from the full score matrix
        with torch.no_grad():
            img, cap, _ = _embed(model, bank, UNIQUE)
            scores = img @ cap.T
            scores.fill_diagonal_(-torch.inf)
            mine = slice(rank * 4, rank * 4 + 4)
            best_cap = scores[mine].max(1)
            best_img = scores.T[mine].max(1)
            sims = torch.cat([best_cap.values, best_img.values])
            remote = torch.cat([best_cap.indices, best_img.indices]) // 4 != rank
        assert res["mh"]["stats"]["neg/hardest_sim"] == pytest.approx(sims.mean().item(), rel=1e-12)
        assert res["mh"]["stats"]["neg/remote_hardest_frac"] == pytest.approx(remote.double().mean().item())


def test_rows_per_worker_and_draw_validation() -> None:
    assert rows_per_worker(8, None, 2) == 4
    assert rows_per_worker(8, 3, 2) == 4
    assert rows_per_worker(8, 16, 2) == 8
    with pytest.raises(ValueError):
        rows_per_worker(8, 15, 2)
    with pytest.raises(ValueError, match="Generator"):
        sample_negative_set(4, 2, 0, batch_size=8, negative_set_size=3, generator=None)
    plan = sample_negative_set(4, 2, 0, batch_size=8, negative_set_size=None, generator=None)
    assert plan.key_rows is None and plan.query_rows.tolist() == [0, 1, 2, 3]


def test_world_size_one_is_ranking_loss() -> None:
    """Without a process group the cross-worker loss is the single-process loss (gather is the identity)."""
    model = TinyVSE()
    bank = _bank(model)
    img, cap, ids = _embed(model, bank, DUP_LOCAL)
    for hardest in (False, True):
        got = cross_worker_ranking_loss(img, cap, image_ids=torch.tensor(ids), hardest=hardest)
        torch.testing.assert_close(got, ranking_loss(img, cap, hardest=hardest, image_ids=torch.tensor(ids)))
    with pytest.raises(ValueError, match="expected 8"):
        step_ranking_loss(
            img[:4], cap[:4], image_ids=None, loss_cfg=LossSection(), batch_size=8, hardest=True
        )
