"""The miners as registered classes (raydist.losses.miners): each triplet miner against its definition over all
triplets, the skew η it reports against the definition's draw probabilities, a user's miner class and a module
dropped into the package; the distance, similarity and reducer objects; the hardest-negative miner (tiled, no
autograd) and the mined MH/SH terms against dense and brute-force references. All in float64."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_losses_triplets import (
    DETERMINISTIC,
    LABEL_SETS,
    RANDOM_STRATEGIES,
    as_list,
    brute_force_mine,
    distance_table,
    draw_probabilities,
    negatives_of,
    positive_pairs,
    unit_rows,
)

import raydist
from raydist.losses import (
    DISTANCES,
    MINERS,
    REDUCERS,
    SIMILARITIES,
    RankingInputs,
    TripletMiner,
    Triplets,
    get_miner,
    l2_normalize,
    mine_hardest_negatives,
    mined_ranking_terms,
    ranking_terms,
)
from raydist.losses.distances import get_distance
from raydist.losses.miners import Miner, PairMiner, register_miner
from raydist.losses.reducers import get_reducer
from raydist.losses.similarity import get_similarity


def _batch(q: int, k: int, seed: int = 0, dim: int = 5):
    g = torch.Generator().manual_seed(seed)
    emb = [l2_normalize(torch.randn(n, dim, generator=g, dtype=torch.float64)) for n in (q, q, k, k)]
    return [e.requires_grad_() for e in emb]


@pytest.mark.parametrize("tile", [1, 3, 64])
@pytest.mark.parametrize("similarity", ["dot", "order"])
def test_hardest_negatives_match_brute_force(tile: int, similarity: str) -> None:
    qi, qc, ki, kc = _batch(6, 11, seed=tile)
    query_ids = torch.tensor([0, 1, 2, 3, 4, 5])
    key_ids = torch.tensor([0, 0, 1, 7, 8, 9, 2, 3, 10, 11, 12])
    got = mine_hardest_negatives(
        RankingInputs(qi, qc, ki, kc, query_ids, key_ids), similarity=similarity, tile=tile
    )

    def s(a, b):
        a, b = a.detach(), b.detach()
        return float(a @ b) if similarity == "dot" else -float((b - a).clamp(min=0).pow(2).sum())

    masked = 0
    for q in range(6):
        negs = [k for k in range(11) if key_ids[k] != query_ids[q]]
        masked += sum(1 for k in range(11) if key_ids[k] == query_ids[q] and k != q)
        img_best = max(negs, key=lambda k: s(qi[q], kc[k]))
        cap_best = max(negs, key=lambda k: s(ki[k], qc[q]))
        assert int(got.image_query_key[q]) == img_best
        assert int(got.caption_query_key[q]) == cap_best
        assert float(got.image_query_score[q]) == pytest.approx(s(qi[q], kc[img_best]), rel=1e-12)
    assert got.masked_pairs == 2 * masked


@pytest.mark.parametrize("hardest", [True, False])
@pytest.mark.parametrize("square", [True, False])
def test_mined_terms_equal_dense_reference(hardest: bool, square: bool) -> None:
    """Values and gradients of the mined path equal the dense [Q, K] formulation (float64)."""
    qi, qc, ki, kc = _batch(7, 7 if square else 12, seed=4)
    if square:
        ki, kc = qi, qc
    ids_q = torch.tensor([0, 1, 2, 3, 4, 5, 1])
    ids_k = ids_q if square else torch.tensor([0, 1, 2, 9, 9, 5, 6, 7, 8, 1, 10, 11])
    inputs = RankingInputs(qi, qc, ki, kc, ids_q, ids_k)
    img_t, cap_t, _ = mined_ranking_terms(inputs, margin=0.3, hardest=hardest, tile=2)
    ref = ranking_terms(inputs, margin=0.3, hardest=hardest)
    torch.testing.assert_close(img_t, ref.image_queries, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(cap_t, ref.caption_queries, rtol=1e-12, atol=1e-14)
    leaves = [qi, qc] if square else [qi, qc, ki, kc]
    got = torch.autograd.grad(img_t.sum() + cap_t.sum(), leaves)
    want = torch.autograd.grad(ref.image_queries.sum() + ref.caption_queries.sum(), leaves)
    for a, b in zip(got, want, strict=False):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_query_without_negative_is_unmined() -> None:
    qi, qc, ki, kc = _batch(2, 3)
    mined = mine_hardest_negatives(
        RankingInputs(qi, qc, ki, kc, torch.tensor([1, 2]), torch.tensor([1, 1, 2])), tile=2
    )
    assert mined.image_query_key[0] == 2 and int(mined.image_query_key[1]) in (0, 1)
    all_same = mine_hardest_negatives(
        RankingInputs(qi, qc, ki, kc, torch.tensor([1, 1]), torch.tensor([1, 1, 1]))
    )
    assert all_same.image_query_key.tolist() == [-1, -1] and all_same.caption_query_key.tolist() == [-1, -1]


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("labels", LABEL_SETS.values(), ids=LABEL_SETS.keys())
@pytest.mark.parametrize("name", DETERMINISTIC)
def test_each_deterministic_miner_class_is_its_definition(
    name: str, labels: list[int], distance: str
) -> None:
    """The class registered under each name, built with its options and called on raw rows, gives exactly the
    triplets its definition picks from all (a, p, n) of the batch."""
    raw = 3.0 * unit_rows(len(labels), seed=11)
    miner = get_miner(name, margin=0.6, distance=distance)
    assert isinstance(miner, TripletMiner) and miner.name == name and not miner.random
    got = miner(raw, torch.tensor(labels))
    want = brute_force_mine(distance_table(raw / 3.0, distance), labels, name, 0.6)
    assert set(as_list(got)) == want and len(as_list(got)) == len(want)


@pytest.mark.parametrize("name", RANDOM_STRATEGIES)
def test_each_random_miner_draws_inside_its_definition(name: str) -> None:
    """One triplet per drawable pair, each negative one the definition gives a positive probability."""
    labels = LABEL_SETS["singleton"]
    emb = unit_rows(len(labels), seed=5)
    miner = get_miner(name, margin=0.8)
    assert miner.random
    want = draw_probabilities(emb, labels, name, 0.8, "euclidean")
    got = as_list(miner(emb, torch.tensor(labels), torch.Generator().manual_seed(3)))
    assert sorted((a, p) for a, p, _ in got) == sorted(want)
    assert all(want[(a, p)].get(n, 0) > 0 for a, p, n in got)


def _skew(emb: torch.Tensor, labels: list[int], triplets: list, name: str, margin: float) -> float:
    """η = mean over the triplets of (negatives of the anchor) × P(n | a, p), P from the definition (1 for a
    deterministic miner)."""
    probs = draw_probabilities(emb, labels, name, margin, "euclidean") if name in RANDOM_STRATEGIES else None
    terms = [len(negatives_of(labels, a)) * (probs[(a, p)][n] if probs else 1.0) for a, p, n in triplets]
    return sum(terms) / len(terms)


@pytest.mark.parametrize("name", MINERS.names())
def test_each_miner_reports_its_skew(name: str) -> None:
    labels = LABEL_SETS["balanced"]
    emb = unit_rows(len(labels), seed=2)
    miner = get_miner(name, margin=0.8)
    triplets = miner(emb, torch.tensor(labels), torch.Generator().manual_seed(0))
    assert miner.skew(emb, torch.tensor(labels), triplets) == pytest.approx(
        _skew(emb, labels, as_list(triplets), name, 0.8), rel=1e-12
    )
    empty = Triplets(*(torch.zeros(0, dtype=torch.long),) * 3)
    assert miner.skew(emb, torch.tensor(labels), empty) is None


def test_uniform_sampling_has_skew_one() -> None:
    labels = torch.tensor(LABEL_SETS["singleton"])
    emb = unit_rows(len(labels), seed=9)
    miner = get_miner("one-to-one")
    assert miner.skew(emb, labels, miner(emb, labels, torch.Generator().manual_seed(1))) == pytest.approx(1.0)


class FarthestNegative(PairMiner):
    """A user's miner: per (a, p), the negative farthest from a."""

    def negative_weights(self, emb, dist, negative, anchors, positives):
        return negative[anchors].to(dist.dtype)

    def mine(self, emb, labels, generator):
        found = super().mine(emb, labels, generator)  # the closest negative of every pair, replaced below
        dist = self.distance.pairwise(emb, emb)
        far = dist.masked_fill(labels[:, None] == labels[None, :], -math.inf).argmax(1)
        return found._replace(negatives=far[found.anchors])


def test_a_users_miner_class_is_a_registered_miner_the_triplet_loss_takes() -> None:
    from raydist.config import Config, apply_overrides
    from raydist.losses import get_loss

    register_miner("farthest", FarthestNegative)
    try:
        assert MINERS.get("farthest") is FarthestNegative and FarthestNegative.name == "farthest"
        cfg = apply_overrides(
            Config(), {"loss.kind": "triplet", "loss.miner": "farthest", "loss.margin": 3.0}
        )
        loss = get_loss("triplet")(cfg)
        assert isinstance(loss.miner, FarthestNegative) and loss.miner.margin == 3.0
        labels = LABEL_SETS["balanced"]
        emb = unit_rows(len(labels), seed=4)
        table = distance_table(emb, "euclidean")
        want = {
            (a, p, max(negatives_of(labels, a), key=lambda n: (table[a][n], -n)))
            for a, p in positive_pairs(labels)
        }
        assert set(as_list(loss.miner(emb, torch.tensor(labels)))) == want
    finally:
        MINERS.unregister("farthest")
    assert "farthest" not in MINERS


def test_a_users_mining_function_is_a_registered_miner_with_its_name() -> None:
    def first_negative(emb, labels, *, margin, distance, generator=None):
        positive, negative = (labels[:, None] == labels[None, :]), labels[:, None] != labels[None, :]
        pairs = (positive & ~torch.eye(len(labels), dtype=torch.bool)).nonzero(as_tuple=True)
        return Triplets(pairs[0], pairs[1], negative.double().argmax(1)[pairs[0]])

    register_miner("first", Miner(first_negative))
    try:
        miner = get_miner("first", distance="cosine")
        assert (miner.name, miner.random, miner.distance.name) == ("first", False, "cosine")
        labels = torch.tensor([0, 0, 1, 1])
        triplets = miner(torch.eye(4, dtype=torch.float64), labels)
        assert as_list(triplets) == [(0, 1, 2), (1, 0, 2), (2, 3, 0), (3, 2, 0)]
        assert miner.skew(torch.eye(4), labels, triplets) is None  # no probabilities given
    finally:
        MINERS.unregister("first")


def test_register_miner_refuses_what_is_not_a_miner() -> None:
    with pytest.raises(ValueError, match="expected a TripletMiner subclass"):
        register_miner("not-a-miner", lambda emb, labels: None)
    assert "not-a-miner" not in MINERS


DROPPED_MINER = """
from raydist.losses.miners import MINERS, TripletMiner, Triplets, label_masks


@MINERS.register("first-negative")
class FirstNegative(TripletMiner):
    def mine(self, emb, labels, generator):
        positive, negative = label_masks(labels)
        anchors, positives = positive.nonzero(as_tuple=True)
        return Triplets(anchors, positives, negative.float().argmax(1)[anchors])
"""

FOUND = """
import json, torch
from raydist.config import load_config
from raydist.losses import MINERS, get_loss
cfg = load_config(overrides={"loss.kind": "triplet", "loss.miner": "first-negative"})
miner = get_loss("triplet")(cfg).miner
got = miner(torch.eye(4, dtype=torch.float64), torch.tensor([0, 0, 1, 1]))
print(json.dumps({"names": MINERS.names(), "module": MINERS.module_of("first-negative"),
                  "triplets": [t.tolist() for t in got]}))
"""


def test_a_miner_module_dropped_into_the_package_is_found(tmp_path) -> None:
    """A new miner is one file in raydist/losses/miners/ (of a copy of the package, first on the path of a fresh
    process): a run names it as loss.miner with nothing else changed."""
    copy = tmp_path / "raydist"
    shutil.copytree(Path(raydist.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "losses" / "miners" / "first_negative.py").write_text(DROPPED_MINER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", FOUND], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.splitlines()[-1])
    assert "first-negative" in got["names"] and set(MINERS.names()) < set(got["names"])
    assert got["module"] == "raydist.losses.miners.first_negative"
    assert got["triplets"] == [[0, 1, 2, 3], [1, 0, 3, 2], [2, 2, 0, 0]]


@pytest.mark.parametrize("name", DISTANCES.names())
def test_distance_objects_match_loops(name: str) -> None:
    x, y = unit_rows(4, seed=1), unit_rows(3, seed=2)
    distance = get_distance(name)
    assert get_distance(distance) is distance and distance.name == name
    want = torch.tensor(distance_table(torch.cat([x, y]), name), dtype=torch.float64)[:4, 4:]
    torch.testing.assert_close(distance.pairwise(x, y), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(distance.paired(x[:3], y), want.diagonal(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", SIMILARITIES.names())
def test_similarity_objects_match_loops(name: str) -> None:
    img, cap = unit_rows(4, seed=3), unit_rows(3, seed=4)

    def s(i: torch.Tensor, c: torch.Tensor) -> float:
        pairs = list(zip(i.tolist(), c.tolist(), strict=True))
        if name == "dot":
            return sum(a * b for a, b in pairs)
        return -sum(max(0.0, b - a) ** 2 for a, b in pairs)

    similarity = get_similarity(name)
    assert get_similarity(similarity) is similarity and similarity.name == name
    want = torch.tensor([[s(i, c) for c in cap] for i in img], dtype=torch.float64)
    torch.testing.assert_close(similarity.pairwise(img, cap), want, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(similarity.paired(img[:3], cap), want.diagonal(), rtol=1e-12, atol=1e-15)
    assert similarity.width_per_score(7) == (7 if name == "order" else 1)


def test_reducers_match_their_definitions() -> None:
    terms = torch.tensor([0.5, 0.0, 2.0, 0.0, 1.25], dtype=torch.float64)
    want = {"sum": 3.75, "mean": 3.75 / 5, "mean_nonzero": 3.75 / 3}
    assert sorted(REDUCERS.names()) == sorted(want)
    for name, value in want.items():
        reducer = get_reducer(name)
        assert reducer.name == name and float(reducer(terms)) == pytest.approx(value, rel=1e-15)
    assert float(get_reducer("mean").of_total(terms.sum(), 5)) == pytest.approx(0.75, rel=1e-15)
    assert float(get_reducer("sum").of_total(terms.sum(), 5)) == 3.75
    assert [REDUCERS.get(n).reduces_totals() for n in ("sum", "mean", "mean_nonzero")] == [True, True, False]
    with pytest.raises(ValueError, match="needs the terms"):
        get_reducer("mean_nonzero").of_total(terms.sum(), 5)
    empty = torch.zeros(0, dtype=torch.float64, requires_grad=True)
    for name in want:  # nothing to reduce: a graph-connected 0
        value = get_reducer(name)(empty)
        value.backward()
        assert float(value.detach()) == 0.0 and empty.grad is not None


def test_the_documented_miner_is_one_class_a_run_selects() -> None:
    """docs/metric-learning.md's "Adding a miner" example, run as written: registered by its name, it draws each
    pair's negative uniformly among the negatives farther than the positive (its η from those probabilities)."""
    doc = (Path(__file__).parents[1] / "docs" / "metric-learning.md").read_text()
    code = doc.split("## Adding a miner", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/metric-learning.md", "exec"), {"__name__": "docs_example_miner"})
    try:
        labels = LABEL_SETS["singleton"]
        emb = unit_rows(len(labels), seed=6)
        table = distance_table(emb, "euclidean")
        candidates = {
            (a, p): [n for n in negatives_of(labels, a) if table[a][n] > table[a][p]]
            for a, p in positive_pairs(labels)
        }
        miner = get_miner("uniform-farther")
        triplets = miner(emb, torch.tensor(labels), torch.Generator().manual_seed(2))
        got = as_list(triplets)
        assert sorted((a, p) for a, p, _ in got) == sorted(pair for pair, c in candidates.items() if c)
        assert all(n in candidates[(a, p)] for a, p, n in got)
        want = [len(negatives_of(labels, a)) / len(candidates[(a, p)]) for a, p, _ in got]
        assert miner.skew(emb, torch.tensor(labels), triplets) == pytest.approx(
            sum(want) / len(want), rel=1e-12
        )
    finally:
        MINERS.unregister("uniform-farther")
