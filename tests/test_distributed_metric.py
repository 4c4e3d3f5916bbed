"""Cross-worker triplet and margin losses under DDP (2 gloo processes) vs one process on the global batch.

One spawn of 2 workers runs every miner × {triplet, margin} (plus reductions, distances, per-class β and two
broken variants) on a tiny float64 model; the references are the single-process losses of
raydist.losses.triplets / margin on the concatenated 12 rows with the same generator seed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from raydist.distributed.gather import all_gather_tensor
from raydist.distributed.spawn import spawn
from raydist.losses import cross_worker_metric_loss
from raydist.losses.margin import MarginBeta, margin_loss, margin_loss_parts
from raydist.losses.miners import MINERS
from raydist.losses.triplets import (
    Triplets,
    mine_triplets,
    reduce_terms,
    triplet_loss,
    triplet_terms,
)

WORLD, ROWS, FEATURES, DIM = 2, 6, 6, 4
MINER_STRATEGIES = MINERS.names()
# classes 3 and 4 have one sample; every other class has rows on both ranks
LABELS = torch.tensor([0, 1, 2, 0, 1, 3, 2, 0, 1, 2, 4, 0])
NUM_CLASSES = 5


class TinyEmbedder(nn.Module):
    """Linear projection, L2-normalised (float64); with a learnable margin-loss β when ``beta`` is given."""

    def __init__(self, beta: str | None = None) -> None:
        super().__init__()
        self.proj = nn.Linear(FEATURES, DIM, dtype=torch.float64)
        classes = NUM_CLASSES if beta == "per-class" else None
        self.margin_beta = None if beta is None else MarginBeta(classes, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.proj(x)
        return z / z.norm(dim=1, keepdim=True)


@dataclass(frozen=True)
class Case:
    """One run: loss kind, miner, loss options, and how the per-rank loss is formed."""

    loss: str  # "triplet" or "margin"
    strategy: str
    margin: float = 0.5  # triplet margin (and semi-hard window); margin loss: α = 0.2 for both
    distance: str = "euclidean"
    reduction: str = "mean"
    hinged: bool = True
    beta: str | None = None  # margin loss: "global" or "per-class" learnable β
    nu: float = 0.0
    via: str = "cross"  # "cross": the library; "no-scale": its value / W; "nograd": gather without autograd
    seed: int = 0


CASES = {f"triplet-{s}": Case("triplet", s, seed=i) for i, s in enumerate(MINER_STRATEGIES)}
CASES.update(
    {
        f"margin-{s}": Case("margin", s, margin=0.2, beta="global", nu=0.01, seed=i)
        for i, s in enumerate(MINER_STRATEGIES)
    }
)
CASES.update(
    {
        "triplet-sum-cosine-unhinged": Case(
            "triplet",
            "semihard-random",
            margin=0.3,
            distance="cosine",
            reduction="sum",
            hinged=False,
            seed=21,
        ),
        "triplet-mean_nonzero": Case("triplet", "one-to-one", reduction="mean_nonzero", seed=22),
        "margin-per-class": Case(
            "margin", "distance-weighted", margin=0.2, beta="per-class", nu=0.01, seed=23
        ),
        "margin-sum-cosine": Case(
            "margin", "one-to-one", margin=0.2, distance="cosine", reduction="sum", beta="global", seed=24
        ),
        "no-scale": Case("triplet", "semihard-random", via="no-scale", seed=25),
        "nograd": Case("margin", "one-to-one", margin=0.2, beta="global", via="nograd", seed=26),
    }
)
CORRECT = [name for name, case in CASES.items() if case.via == "cross"]


def _miner(case: Case) -> partial:
    return partial(mine_triplets, strategy=case.strategy, margin=case.margin, distance=case.distance)


def _loss_parts(case: Case, model: TinyEmbedder):
    if case.loss == "margin":
        return partial(
            margin_loss_parts,
            beta=model.margin_beta.beta,
            alpha=case.margin,
            nu=case.nu,
            distance=case.distance,
            reduction=case.reduction,
        )

    def parts(emb: torch.Tensor, _labels: torch.Tensor, triplets: Triplets):
        terms = triplet_terms(emb, triplets, margin=case.margin, hinged=case.hinged, distance=case.distance)
        return reduce_terms(terms, case.reduction)

    return parts


def _gather_without_grad_loss(emb, labels, *, miner, loss_parts, generator) -> torch.Tensor:
    """The classic bug: keys gathered without autograd (own slice re-inserted with grad); else as the library."""
    rank, rows = dist.get_rank(), emb.shape[0]
    global_emb = all_gather_tensor(emb).clone()
    global_emb[rank * rows : (rank + 1) * rows] = emb
    global_labels = all_gather_tensor(labels)
    triplets = miner(global_emb.detach(), global_labels, generator=generator)
    own = triplets.anchors // rows == rank
    parts = loss_parts(global_emb, global_labels, Triplets(*(t[own] for t in triplets)))
    return WORLD * parts.value(all_gather_tensor(parts.count.reshape(1)).sum())


def _worker(rank: int, init_file: str, states: dict, features: torch.Tensor, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    mine = slice(rank * ROWS, (rank + 1) * ROWS)
    results = {}
    for name, case in CASES.items():
        model = TinyEmbedder(case.beta)
        model.load_state_dict(states[case.beta])
        ddp = DistributedDataParallel(model)
        emb = ddp(features[mine])
        kwargs = {
            "miner": _miner(case),
            "loss_parts": _loss_parts(case, model),
            "generator": torch.Generator().manual_seed(case.seed),
        }
        if case.via == "nograd":
            loss = _gather_without_grad_loss(emb, LABELS[mine], **kwargs)
        else:
            loss = cross_worker_metric_loss(emb, LABELS[mine], **kwargs)
        if case.via == "no-scale":
            loss = loss / WORLD
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        results[name] = {"loss": loss.item(), "grads": grads}
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def _states() -> dict:
    """Initial weights per β kind (rank 0's; DDP broadcasts them anyway); per-class β spread around 1.2."""
    states = {}
    for kind in (None, "global", "per-class"):
        torch.manual_seed(0)
        model = TinyEmbedder(kind)
        if kind == "per-class":
            with torch.no_grad():
                model.margin_beta.beta.copy_(torch.tensor([1.0, 1.1, 1.2, 1.3, 1.4]))
        states[kind] = model.state_dict()
    return states


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Spawn the 2 workers once; return the inputs and each rank's results."""
    out = tmp_path_factory.mktemp("ddp_metric")
    states = _states()
    features = torch.randn(
        WORLD * ROWS, FEATURES, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spawn(_worker, (str(out / "init"), states, features, str(out)), nprocs=WORLD)
    return {
        "states": states,
        "features": features,
        "ranks": [torch.load(out / f"rank{r}.pt") for r in range(WORLD)],
    }


def reference(case: Case, states: dict, features: torch.Tensor, seed: int | None = None) -> tuple:
    """Single-process loss, triplet count and parameter gradients on the 12 concatenated rows."""
    model = TinyEmbedder(case.beta)
    model.load_state_dict(states[case.beta])
    emb = model(features)
    generator = torch.Generator().manual_seed(case.seed if seed is None else seed)
    triplets = mine_triplets(
        emb, LABELS, strategy=case.strategy, margin=case.margin, distance=case.distance, generator=generator
    )
    if case.loss == "margin":
        loss = margin_loss(
            emb,
            LABELS,
            alpha=case.margin,
            beta=model.margin_beta.beta,
            triplets=triplets,
            distance=case.distance,
            reduction=case.reduction,
            nu=case.nu,
        )
    else:
        loss = triplet_loss(
            emb,
            triplets,
            margin=case.margin,
            hinged=case.hinged,
            distance=case.distance,
            reduction=case.reduction,
        )
    names, params = zip(*model.named_parameters(), strict=False)
    return loss, len(triplets.anchors), dict(zip(names, torch.autograd.grad(loss, params), strict=False))


def _relative_gap(got: dict, want: dict) -> float:
    num = sum(float((got[n] - want[n]).norm() ** 2) for n in want) ** 0.5
    return num / sum(float(want[n].norm() ** 2) for n in want) ** 0.5


@pytest.mark.slow
@pytest.mark.gloo
@pytest.mark.timeout(120)
def test_ddp_gradients_match_single_process(runs: dict) -> None:
    """Every case: both ranks hold the single-process gradients (model and β) to 1e-9, and the mean over
    ranks of the returned values is the single-process loss."""
    for name in CORRECT:
        case = CASES[name]
        ranks = [r[name] for r in runs["ranks"]]
        loss, count, want = reference(case, runs["states"], runs["features"])
        grad_norm = sum(float(g.norm() ** 2) for g in want.values()) ** 0.5
        assert count > 0 and loss.abs() > 0 and grad_norm > 0, name
        for rank in ranks:
            for n, expected in want.items():
                torch.testing.assert_close(
                    rank["grads"][n],
                    expected,
                    rtol=1e-9,
                    atol=1e-12,
                    msg=lambda m, n=n, name=name: f"{name} {n}: {m}",
                )
        assert sum(r["loss"] for r in ranks) / WORLD == pytest.approx(loss.item(), rel=1e-12), name
        if case.beta is not None:
            assert want["margin_beta.beta"].abs().max() > 0, name


@pytest.mark.slow
@pytest.mark.gloo
@pytest.mark.timeout(120)
def test_broken_variants_fail_the_comparison(runs: dict) -> None:
    """Without the ×W, or with a gather that drops the other ranks' gradients, the comparison fails; so does a
    reference drawn with another seed (the ranks really reproduce the single-process draws)."""
    states, features, rank0 = runs["states"], runs["features"], runs["ranks"][0]
    for name in ("no-scale", "nograd"):
        _, _, want = reference(CASES[name], states, features)
        assert _relative_gap(rank0[name]["grads"], want) > 1e-3, name
    for name in ("triplet-one-to-one", "margin-distance-weighted", "triplet-semihard-random"):
        _, _, other_draws = reference(CASES[name], states, features, seed=1000)
        assert _relative_gap(rank0[name]["grads"], other_draws) > 1e-3, name


def test_one_process_is_the_single_process_loss() -> None:
    """Without a process group the cross-worker loss equals the plain loss (gather is the identity)."""
    states = _states()
    features = torch.randn(
        WORLD * ROWS, FEATURES, generator=torch.Generator().manual_seed(4), dtype=torch.float64
    )
    for name in ("triplet-semihard-random", "margin-per-class", "triplet-mean_nonzero"):
        case = CASES[name]
        model = TinyEmbedder(case.beta)
        model.load_state_dict(states[case.beta])
        got = cross_worker_metric_loss(
            model(features),
            LABELS,
            miner=_miner(case),
            loss_parts=_loss_parts(case, model),
            generator=torch.Generator().manual_seed(case.seed),
        )
        want, _, _ = reference(case, states, features)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
