"""The hardest-negative miner (tiled, no autograd) and the mined MH/SH terms against dense and brute-force
references in float64."""

from __future__ import annotations

import pytest
import torch

from raydist.losses import (
    RankingInputs,
    l2_normalize,
    mine_hardest_negatives,
    mined_ranking_terms,
    ranking_terms,
)


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
