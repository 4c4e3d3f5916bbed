"""Tiled MH (hardest-negative miner + mined hinge) and tiled SH (raydist/losses/tiled_sh.py) against the
dense reference ``ranking_terms`` and brute-force loops, in float64, for tiles smaller than, odd and
larger than the key count, one or many query rows per tile, square and rectangular, with duplicate ids."""

from __future__ import annotations

import pytest
import torch

from raydist.losses import (
    RankingInputs,
    l2_normalize,
    mine_hardest_negatives,
    mined_ranking_terms,
    paired_similarity,
    ranking_terms,
    score_tiles,
    sum_of_hinges,
    tiles,
)
from raydist.losses.miners import hardest_negatives
from raydist.losses.tiled_sh import TiledSumOfHinges

QUERY_IDS = torch.tensor([0, 1, 2, 3, 4, 5, 1, 6, 7, 3, 8, 9])
KEY_IDS = torch.tensor([0, 1, 2, 9, 9, 5, 6, 7, 8, 1, 10, 11, 3, 12, 13, 14, 15, 1, 16, 17])


def _embeddings(q: int, k: int, dim: int = 5, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    emb = [l2_normalize(torch.randn(n, dim, generator=g, dtype=torch.float64)) for n in (q, q, k, k)]
    return [e.requires_grad_() for e in emb]


Case = tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, list[torch.Tensor]]


def _case(square: bool, seed: int = 0) -> Case:
    """(query img, query cap, key img, key cap), query ids, key ids, and the leaves to differentiate."""
    qi, qc, ki, kc = _embeddings(len(QUERY_IDS), len(KEY_IDS), seed=seed)
    if square:
        return [qi, qc, qi, qc], QUERY_IDS, QUERY_IDS, [qi, qc]
    return [qi, qc, ki, kc], QUERY_IDS, KEY_IDS, [qi, qc, ki, kc]


@pytest.fixture(params=[(1 << 22, 64), (5, 4)], ids=["one-query-block", "many-query-blocks"])
def tiling(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Default tiling (every query in one block) or 5-score tiles with 4-member arg-max classes."""
    elements, group = request.param
    monkeypatch.setattr(tiles, "TILE_ELEMENTS", elements)
    monkeypatch.setattr(hardest_negatives, "ARGMAX_GROUP", group)


@pytest.mark.usefixtures("tiling")
@pytest.mark.parametrize("tile", [1, 3, 8, 64])
@pytest.mark.parametrize("square", [True, False], ids=["square", "rectangular"])
@pytest.mark.parametrize("hardest", [True, False], ids=["MH", "SH"])
@pytest.mark.parametrize("similarity", ["dot", "order"])
def test_tiled_terms_equal_dense_reference(tile: int, square: bool, hardest: bool, similarity: str) -> None:
    """Values and gradients (float64) of the tiled MH/SH per-query terms equal the dense [Q, K] ones."""
    emb, ids_q, ids_k, leaves = _case(square, seed=tile)
    margin = 0.3 if similarity == "dot" else 0.6
    inputs = RankingInputs(*emb, ids_q, ids_k)
    img_t, cap_t, _ = mined_ranking_terms(
        inputs, margin=margin, hardest=hardest, similarity=similarity, tile=tile
    )
    ref = ranking_terms(inputs, margin=margin, hardest=hardest, similarity=similarity)
    assert (ref.image_queries > 0).any() and (ref.caption_queries > 0).any()
    torch.testing.assert_close(img_t, ref.image_queries, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(cap_t, ref.caption_queries, rtol=1e-12, atol=1e-14)
    weights = torch.linspace(0.5, 1.5, len(ids_q), dtype=torch.float64)  # distinct upstream gradients
    got = torch.autograd.grad((weights * img_t).sum() + (weights.flip(0) * cap_t).sum(), leaves)
    want = torch.autograd.grad(
        (weights * ref.image_queries).sum() + (weights.flip(0) * ref.caption_queries).sum(), leaves
    )
    for a, b in zip(got, want, strict=False):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.usefixtures("tiling")
@pytest.mark.parametrize("tile", [1, 3, 8, 64])
@pytest.mark.parametrize("square", [True, False], ids=["square", "rectangular"])
def test_tiled_miner_matches_brute_force(tile: int, square: bool) -> None:
    """Keys, scores and the masked-pair count of the tiled miner against a loop over every (query, key)."""
    (qi, qc, ki, kc), ids_q, ids_k, _ = _case(square, seed=10 + tile)
    got = mine_hardest_negatives(RankingInputs(qi, qc, ki, kc, ids_q, ids_k), tile=tile)
    img_scores, cap_scores = (qi @ kc.T).detach(), (ki @ qc.T).T.detach()
    masked = 0
    for q in range(len(ids_q)):
        negatives = [k for k in range(len(ids_k)) if ids_k[k] != ids_q[q]]
        masked += sum(1 for k in range(len(ids_k)) if ids_k[k] == ids_q[q] and k != q)
        assert int(got.image_query_key[q]) == max(negatives, key=lambda k: float(img_scores[q, k]))
        assert int(got.caption_query_key[q]) == max(negatives, key=lambda k: float(cap_scores[q, k]))
        for score, scores in ((got.image_query_score, img_scores), (got.caption_query_score, cap_scores)):
            assert float(score[q]) == pytest.approx(float(scores[q, negatives].max()), rel=1e-12)
    assert got.masked_pairs == 2 * masked


def test_miner_takes_an_earlier_key_on_exact_ties(monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal scores: the first negative key wins, as in ``argmax`` of the masked dense scores."""
    monkeypatch.setattr(hardest_negatives, "ARGMAX_GROUP", 2)
    emb = torch.ones(1, 2, dtype=torch.float64)
    keys = torch.ones(8, 2, dtype=torch.float64)
    inputs = RankingInputs(emb, emb, keys, keys, torch.tensor([0]), torch.tensor([0, 1, 2, 3, 4, 5, 6, 7]))
    got = mine_hardest_negatives(inputs, tile=4)
    assert int(got.image_query_key[0]) == 1 and int(got.caption_query_key[0]) == 1


@pytest.mark.parametrize("blocks", [(1, 1), (2, 3), (5, 7), (40, 40)])
def test_score_tiles_list_every_same_id_entry(blocks: tuple[int, int]) -> None:
    """The tiles cover the matrix once and their same-id entries are exactly ``row_ids[r] == col_ids[c]``."""
    covered = torch.zeros(len(QUERY_IDS), len(KEY_IDS), dtype=torch.long)
    same = torch.zeros_like(covered, dtype=torch.bool)
    for t in score_tiles(QUERY_IDS, KEY_IDS, *blocks):
        covered[t.rows, t.cols] += 1
        block = torch.zeros_like(covered[t.rows, t.cols], dtype=torch.bool)
        block[t.same_rows, t.same_cols] = True
        assert int(block.sum()) == t.same_rows.numel()  # no entry listed twice
        same[t.rows, t.cols] = block
    assert bool((covered == 1).all())
    assert torch.equal(same, QUERY_IDS.unsqueeze(1) == KEY_IDS.unsqueeze(0))


@pytest.mark.parametrize("square", [True, False], ids=["square", "rectangular"])
def test_sum_of_hinges_gradcheck(square: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.autograd.gradcheck`` of the SH function (positives an input) with several query blocks."""
    monkeypatch.setattr(tiles, "TILE_ELEMENTS", 6)
    ids_q, ids_k = torch.tensor([0, 1, 1, 2, 3]), torch.tensor([0, 1, 4, 2, 5, 3, 6])
    qi, qc, ki, kc = _embeddings(5, 7, dim=3, seed=3)
    positives = paired_similarity(qi, qc).detach().requires_grad_()
    if square:

        def terms(p: torch.Tensor, i: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return sum_of_hinges(p, RankingInputs.batch(i, c, ids_q), margin=0.5, tile=2)

        inputs = (positives, qi, qc)
    else:

        def terms(p: torch.Tensor, *emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return sum_of_hinges(p, RankingInputs(*emb, ids_q, ids_k), margin=0.5, tile=3)

        inputs = (positives, qi, qc, ki, kc)
    assert all((t > 0).any() for t in terms(*inputs))
    assert torch.autograd.gradcheck(terms, inputs)


def test_sum_of_hinges_keeps_no_score_matrix_for_backward() -> None:
    """Only the inputs are saved: nothing of size Q·K survives the forward."""
    qi, qc, ki, kc = _embeddings(6, 9)
    inputs = RankingInputs(qi, qc, ki, kc, torch.arange(6), torch.arange(9))
    img_t, _ = sum_of_hinges(paired_similarity(qi, qc), inputs, margin=0.2, tile=2)
    node = img_t.grad_fn
    assert node.name().startswith(TiledSumOfHinges.__name__)
    assert max(t.numel() for t in node.saved_tensors) == 9 * 5
