"""Matryoshka loss against hand-written float64 sums over independently normalised prefixes."""

import numpy as np
import pytest
import torch

from raydist.losses.nested import nested_loss, nested_views
from raydist.losses.ranking import ranking_loss
from raydist.losses.similarity import l2_normalize


def unit_prefix(x: np.ndarray, m: int) -> np.ndarray:
    p = x[:, :m]
    return p / np.sqrt((p * p).sum(1, keepdims=True))


def vsepp_mh(img: np.ndarray, cap: np.ndarray, margin: float) -> float:
    """VSE++ MH loss by loops: Σ_k max_{l≠k} [α − S_kk + S_kl]₊ + Σ_l max_{k≠l} [α − S_ll + S_kl]₊."""
    s = img @ cap.T
    n = len(s)
    total = 0.0
    for k in range(n):
        total += max(max(0.0, margin - s[k, k] + s[k, j]) for j in range(n) if j != k)
        total += max(max(0.0, margin - s[k, k] + s[j, k]) for j in range(n) if j != k)
    return total


def squared_sum(z: torch.Tensor) -> torch.Tensor:
    return (z.sum(0) ** 2).sum()


def test_single_full_dim_is_the_plain_loss():
    x = torch.randn(12, 16)
    nested = nested_loss(squared_sum, [16])
    assert torch.equal(nested(x), squared_sum(l2_normalize(x)))


def test_gradient_beyond_largest_prefix_is_zero():
    x = torch.randn(10, 32, requires_grad=True)
    nested_loss(squared_sum, [4, 8, 20])(x).backward()
    assert torch.equal(x.grad[:, 20:], torch.zeros(10, 12))
    assert (x.grad[:, :20].abs() > 0).any(1).all()


def test_weights_scale_each_prefix_term():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 24))
    dims, weights = [3, 6, 12, 24], [0.5, 2.0, 0.0, 1.5]
    expected = sum(
        c * float((unit_prefix(x, m).sum(0) ** 2).sum()) for m, c in zip(dims, weights, strict=False)
    )
    got = nested_loss(squared_sum, dims, weights)(torch.from_numpy(x))
    assert got.dtype == torch.float64
    assert got.item() == pytest.approx(expected, rel=1e-12)


def test_default_weights_are_one_and_terms_are_unweighted():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((7, 10))
    nested = nested_loss(squared_sum, [2, 5, 10])
    terms = [float((unit_prefix(x, m).sum(0) ** 2).sum()) for m in (2, 5, 10)]
    np.testing.assert_allclose([t.item() for t in nested.terms(torch.from_numpy(x))], terms, rtol=1e-12)
    assert nested(torch.from_numpy(x)).item() == pytest.approx(sum(terms), rel=1e-12)


def test_ranking_loss_on_image_caption_pairs():
    rng = np.random.default_rng(2)
    img = rng.standard_normal((8, 32))
    cap = img + 0.8 * rng.standard_normal((8, 32))
    dims, weights, margin = [4, 8, 32], [1.0, 0.5, 2.0], 0.2
    expected = sum(
        c * vsepp_mh(unit_prefix(img, m), unit_prefix(cap, m), margin)
        for m, c in zip(dims, weights, strict=False)
    )
    nested = nested_loss(ranking_loss, dims, weights)
    got = nested((torch.from_numpy(img), torch.from_numpy(cap)), margin=margin, hardest=True)
    assert got.item() == pytest.approx(expected, rel=1e-12)


def test_extra_positional_args_pass_through():
    x = torch.randn(6, 8, dtype=torch.float64)
    scale = torch.tensor(3.0, dtype=torch.float64)
    nested = nested_loss(lambda z, s: s * squared_sum(z), [4, 8])
    expected = 3.0 * sum(float((unit_prefix(x.numpy(), m).sum(0) ** 2).sum()) for m in (4, 8))
    assert nested(x, scale).item() == pytest.approx(expected, rel=1e-12)


def test_nested_views_are_unit_prefixes():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 12))
    views = nested_views(torch.from_numpy(x), (3, 12))
    assert [tuple(v.shape) for v in views] == [(5, 3), (5, 12)]
    for v, m in zip(views, (3, 12), strict=False):
        np.testing.assert_allclose(v.numpy(), unit_prefix(x, m), rtol=1e-12)


@pytest.mark.parametrize(
    "dims, weights",
    [
        ([], None),
        ([8, 8], None),
        ([0, 4], None),
        ([2.5], None),
        ([True], None),
        ([4, 8], [1.0]),
        ([4, 8], [1.0, -0.1]),
        ([4, 8], [1.0, float("nan")]),
    ],
)
def test_invalid_configuration(dims, weights):
    with pytest.raises((ValueError, TypeError)):
        nested_loss(squared_sum, dims, weights)


def test_largest_dim_checked_on_call():
    nested = nested_loss(squared_sum, [4, 32])
    with pytest.raises(ValueError, match="exceeds the embedding dim 16"):
        nested(torch.randn(3, 16))


def test_embeddings_as_separate_arguments_or_one_sequence():
    """``nested(img, cap)`` and ``nested((img, cap))`` both equal the hand-written sum of MH over prefixes."""
    rng = np.random.default_rng(4)
    img = rng.standard_normal((7, 16))
    cap = img + 0.9 * rng.standard_normal((7, 16))
    dims, weights, margin = [2, 6, 16], [1.5, 1.0, 0.25], 0.2
    expected = sum(
        c * vsepp_mh(unit_prefix(img, m), unit_prefix(cap, m), margin)
        for m, c in zip(dims, weights, strict=False)
    )
    nested = nested_loss(ranking_loss, dims, weights)
    img_t, cap_t = torch.from_numpy(img), torch.from_numpy(cap)
    assert nested(img_t, cap_t, margin=margin).item() == pytest.approx(expected, rel=1e-12)
    assert nested((img_t, cap_t), margin=margin).item() == pytest.approx(expected, rel=1e-12)
    assert [t.item() for t in nested.terms(img_t, cap_t, margin=margin)] == pytest.approx(
        [vsepp_mh(unit_prefix(img, m), unit_prefix(cap, m), margin) for m in dims], rel=1e-12
    )


def test_a_following_tensor_of_another_rank_passes_through():
    """``nested(emb, labels)``: the 1-D labels reach the loss whole, only ``emb`` is sliced."""
    x = torch.randn(6, 8, dtype=torch.float64)
    labels = torch.tensor([0, 1, 0, 1, 1, 1])
    nested = nested_loss(lambda z, y: (z[y == 1].sum(0) ** 2).sum(), [3, 8])
    expected = sum(float((unit_prefix(x.numpy(), m)[labels.numpy() == 1].sum(0) ** 2).sum()) for m in (3, 8))
    assert nested(x, labels).item() == pytest.approx(expected, rel=1e-12)


def test_unsorted_dims_give_the_sorted_loss_with_their_weights():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((9, 24))
    nested = nested_loss(squared_sum, [12, 3, 24, 6], [2.0, 0.5, 1.5, 0.0])
    assert nested.dims == (3, 6, 12, 24)
    expected = sum(
        c * float((unit_prefix(x, m).sum(0) ** 2).sum()) for m, c in ((3, 0.5), (12, 2.0), (24, 1.5))
    )
    assert nested(torch.from_numpy(x)).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "dims, message",
    [
        ([8, 4, 8], "must be distinct, got 8"),
        ([4, 0], "must be positive, got 0"),
        ([4, -2, 8], "must be positive, got -2"),
    ],
)
def test_duplicate_or_non_positive_dims_are_refused_clearly(dims, message):
    with pytest.raises(ValueError, match=message):
        nested_loss(squared_sum, dims)
