"""raydist.losses.ranking / similarity against brute-force python loops in float64
(docs/algorithms.md#ranking-loss)."""

from __future__ import annotations

import pytest
import torch

from raydist.losses import l2_normalize, mh_collapse_value, pairwise_similarity, ranking_loss


def pair_score(img_row: torch.Tensor, cap_row: torch.Tensor, similarity: str) -> torch.Tensor:
    """s(i, c) for one pair, written out per coordinate."""
    if similarity == "dot":
        return sum(img_row[d] * cap_row[d] for d in range(img_row.shape[0]))
    return -sum(torch.clamp(cap_row[d] - img_row[d], min=0.0) ** 2 for d in range(img_row.shape[0]))


def brute_force_loss(
    img: torch.Tensor,
    cap: torch.Tensor,
    ids: list[int],
    *,
    margin: float,
    hardest: bool,
    similarity: str = "dot",
    reduction: str = "sum",
    queries: list[int] | None = None,
    keys: list[int] | None = None,
) -> torch.Tensor:
    """Double loop over queries k and keys l (default: every row) of the bidirectional hinge loss.

    Image query k: ``[α − s(I_k,C_k) + s(I_k,C_l)]₊``; caption query k: ``[α − s(I_k,C_k) + s(I_l,C_k)]₊``,
    over keys l with ``ids[l] != ids[k]``; summed (SH) or maxed (MH, 0 with no negative); "mean" divides
    by twice the number of queries.
    """
    n = img.shape[0]
    queries = list(range(n)) if queries is None else queries
    keys = list(range(n)) if keys is None else keys
    total = img.new_zeros(())
    for k in queries:
        positive = pair_score(img[k], cap[k], similarity)
        image_costs, caption_costs = [], []
        for lk in keys:
            if ids[lk] == ids[k]:
                continue
            image_costs.append(
                torch.clamp(margin - positive + pair_score(img[k], cap[lk], similarity), min=0.0)
            )
            caption_costs.append(
                torch.clamp(margin - positive + pair_score(img[lk], cap[k], similarity), min=0.0)
            )
        for costs in (image_costs, caption_costs):
            if costs:
                total = total + (max(costs) if hardest else sum(costs))
    return total / (2 * len(queries)) if reduction == "mean" else total


def _inputs(n: int = 7, d: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    img = l2_normalize(torch.randn(n, d, generator=g, dtype=torch.float64))
    cap = l2_normalize(torch.randn(n, d, generator=g, dtype=torch.float64))
    return img.requires_grad_(), cap.requires_grad_()


@pytest.mark.parametrize("similarity", ["dot", "order"])
@pytest.mark.parametrize("ids", [None, [0, 1, 1, 2, 3, 3, 3]], ids=["unique", "dup-ids"])
@pytest.mark.parametrize("hardest", [False, True], ids=["SH", "MH"])
def test_matches_brute_force_values_and_gradients(
    hardest: bool, ids: list[int] | None, similarity: str
) -> None:
    img, cap = _inputs()
    margin = 0.2 if similarity == "dot" else 0.5
    image_ids = None if ids is None else torch.tensor(ids)
    got = ranking_loss(img, cap, margin=margin, hardest=hardest, image_ids=image_ids, similarity=similarity)
    want = brute_force_loss(
        img,
        cap,
        list(range(7)) if ids is None else ids,
        margin=margin,
        hardest=hardest,
        similarity=similarity,
    )
    assert want > 0
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    got_grads = torch.autograd.grad(got, (img, cap))
    want_grads = torch.autograd.grad(want, (img, cap))
    for a, b in zip(got_grads, want_grads, strict=False):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_duplicate_ids_are_masked() -> None:
    img, cap = _inputs()
    ids = torch.tensor([0, 1, 1, 2, 3, 3, 3])
    img = img.detach().clone()
    img[2] = img[1]  # two captions of one image: the same image embedding
    masked = ranking_loss(img, cap, image_ids=ids)
    unmasked = ranking_loss(img, cap)
    assert masked < unmasked
    torch.testing.assert_close(masked, brute_force_loss(img, cap, ids.tolist(), margin=0.2, hardest=True))


@pytest.mark.parametrize("hardest", [False, True], ids=["SH", "MH"])
def test_ties_at_zero_hinge(hardest: bool) -> None:
    img, cap = _inputs(n=5)
    img = img.detach().clone()
    img[:] = img[0]  # every S_kl equals S_ll for caption queries: hinge argument exactly 0 at margin 0
    cap = cap.detach().clone()
    cap[3] = cap[1]  # and two identical captions: S_k1 = S_k3 ties for image queries
    img.requires_grad_()
    cap.requires_grad_()
    got = ranking_loss(img, cap, margin=0.0, hardest=hardest)
    want = brute_force_loss(img, cap, list(range(5)), margin=0.0, hardest=hardest)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert all(torch.isfinite(g).all() for g in torch.autograd.grad(got, (img, cap)))


def test_zero_norm_row_gives_finite_loss_and_gradients() -> None:
    g = torch.Generator().manual_seed(1)
    raw_img = torch.randn(4, 3, generator=g, dtype=torch.float64)
    raw_img[2] = 0.0
    raw_img.requires_grad_()
    raw_cap = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    img = l2_normalize(raw_img)
    assert torch.equal(img[2], torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(img[[0, 1, 3]].norm(dim=1), torch.ones(3, dtype=torch.float64))
    for hardest in (False, True):
        loss = ranking_loss(img, l2_normalize(raw_cap), hardest=hardest)
        assert torch.isfinite(loss)
        grads = torch.autograd.grad(loss, (raw_img, raw_cap), retain_graph=True)
        assert all(torch.isfinite(gr).all() for gr in grads)


def test_order_similarity_matches_loop() -> None:
    img, cap = (t.detach() for t in _inputs(n=4, d=3))
    cap = cap[:3]
    got = pairwise_similarity(img, cap, "order")
    assert got.shape == (4, 3)
    for k in range(4):
        for lk in range(3):
            want = -sum(max(0.0, float(cap[lk, d] - img[k, d])) ** 2 for d in range(3))
            assert got[k, lk].item() == pytest.approx(want, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("hardest", [False, True], ids=["SH", "MH"])
def test_mean_reduction_divides_by_2n_query_terms(hardest: bool) -> None:
    img, cap = _inputs()
    ids = torch.tensor([0, 1, 1, 2, 3, 3, 3])
    mean = ranking_loss(img, cap, hardest=hardest, image_ids=ids, reduction="mean")
    want = brute_force_loss(img, cap, ids.tolist(), margin=0.2, hardest=hardest, reduction="mean")
    torch.testing.assert_close(mean, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mean * 14, ranking_loss(img, cap, hardest=hardest, image_ids=ids))


def test_query_without_negatives_contributes_zero_in_mh() -> None:
    img, cap = _inputs(n=4)
    all_masked = ranking_loss(img, cap, hardest=True, image_ids=torch.zeros(4, dtype=torch.long))
    assert all_masked.item() == 0.0
    assert all(
        torch.isfinite(g).all() for g in torch.autograd.grad(all_masked, (img, cap), allow_unused=True)
    )
    ids = [0, 0, 0, 1]
    partly = ranking_loss(img, cap, hardest=True, image_ids=torch.tensor(ids))
    torch.testing.assert_close(partly, brute_force_loss(img, cap, ids, margin=0.2, hardest=True))


def test_sh_gradcheck() -> None:
    g = torch.Generator().manual_seed(2)
    img = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    cap = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)

    def loss(i: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return ranking_loss(l2_normalize(i), l2_normalize(c), margin=0.5, hardest=False)

    assert loss(img, cap) > 0
    assert torch.autograd.gradcheck(loss, (img, cap))


def test_rejects_unknown_options() -> None:
    img, cap = _inputs(n=3)
    with pytest.raises(ValueError, match="reduction"):
        ranking_loss(img, cap, reduction="max")
    with pytest.raises(ValueError, match="similarity"):
        ranking_loss(img, cap, similarity="cosine")


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("n, margin", [(6, 0.2), (9, 0.35)])
def test_mh_collapse_value_is_mh_on_collapsed_embeddings(n: int, margin: float, reduction: str) -> None:
    """Every image and caption row the same unit vector: every score equal, so MH (the brute-force loop and
    ``ranking_loss``) takes its collapse value (2·N·α summed, α averaged)."""
    row = l2_normalize(torch.randn(1, 5, generator=torch.Generator().manual_seed(n), dtype=torch.float64))
    img, cap = row.expand(n, 5), row.expand(n, 5)
    want = brute_force_loss(img, cap, list(range(n)), margin=margin, hardest=True, reduction=reduction)
    assert float(want) == pytest.approx((2 * n * margin) if reduction == "sum" else margin, rel=1e-12)
    assert mh_collapse_value(n, margin, reduction) == pytest.approx(float(want), rel=1e-12)
    got = ranking_loss(img, cap, margin=margin, hardest=True, reduction=reduction)
    assert float(got) == pytest.approx(mh_collapse_value(n, margin, reduction), rel=1e-12)
