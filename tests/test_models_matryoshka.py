"""Matryoshka heads against logits and cross-entropies computed independently in float64 numpy."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raydist.losses import nested_sum
from raydist.models.matryoshka import MatryoshkaHead


def nested_cross_entropy(logits: list[torch.Tensor], y: torch.Tensor, weights=None) -> torch.Tensor:
    """The head's nested loss as the labels task forms it: the one Matryoshka sum, each prefix view picking
    its own logits."""
    dims = range(1, len(logits) + 1)  # only the positions matter here
    return nested_sum(lambda view: F.cross_entropy(view.pick(logits), y), dims, weights)


def cross_entropy(logits: np.ndarray, target: np.ndarray) -> float:
    """Batch mean of ``logsumexp(l) − l[y]``."""
    top = logits.max(1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(1)) + top[:, 0]
    return float(np.mean(lse - logits[np.arange(len(target)), target]))


def test_efficient_logits_slice_one_shared_matrix():
    torch.manual_seed(0)
    head = MatryoshkaHead(16, 5, [2, 4, 16]).double()
    z = torch.randn(7, 16, dtype=torch.float64)
    w = head.shared.weight.detach().numpy()
    b = head.shared.bias.detach().numpy()
    logits = head(z)
    assert len(logits) == 3
    for lg, m in zip(logits, (2, 4, 16), strict=False):
        expected = np.array(
            [[sum(z[i, j].item() * w[c, j] for j in range(m)) + b[c] for c in range(5)] for i in range(7)]
        )
        np.testing.assert_allclose(lg.detach().numpy(), expected, rtol=1e-12, atol=1e-12)


def test_parameter_counts():
    efficient = MatryoshkaHead(32, 10, [8, 16, 32], efficient=True)
    separate = MatryoshkaHead(32, 10, [8, 16, 32], efficient=False)
    assert sum(p.numel() for p in efficient.parameters()) == 10 * 32 + 10
    assert sum(p.numel() for p in separate.parameters()) == sum(10 * m + 10 for m in (8, 16, 32))


def test_separate_heads_see_their_prefix():
    torch.manual_seed(1)
    head = MatryoshkaHead(12, 3, [4, 12], efficient=False).double()
    z = torch.randn(5, 12, dtype=torch.float64)
    for lg, lin, m in zip(head(z), head.heads, (4, 12), strict=False):
        expected = z[:, :m].numpy() @ lin.weight.detach().numpy().T + lin.bias.detach().numpy()
        np.testing.assert_allclose(lg.detach().numpy(), expected, rtol=1e-12)


@pytest.mark.parametrize("efficient", [True, False])
def test_one_nesting_dim_is_a_plain_linear_classifier(efficient):
    torch.manual_seed(2)
    head = MatryoshkaHead(8, 4, [8], efficient=efficient).double()
    plain = nn.Linear(8, 4).double()
    source = head.shared if efficient else head.heads[0]
    with torch.no_grad():
        plain.weight.copy_(source.weight)
        plain.bias.copy_(source.bias)
    z = torch.randn(6, 8, dtype=torch.float64)
    y = torch.tensor([0, 3, 1, 1, 2, 0])
    (logits,) = head(z)
    assert torch.equal(logits, plain(z))
    expected = cross_entropy(plain(z).detach().numpy(), y.numpy())
    assert nested_cross_entropy([logits], y).item() == pytest.approx(expected, rel=1e-12)


def test_nested_cross_entropy_weights():
    rng = np.random.default_rng(3)
    logits = [rng.standard_normal((9, 6)) for _ in range(3)]
    y = rng.integers(0, 6, size=9)
    weights = [0.25, 0.0, 3.0]
    expected = sum(c * cross_entropy(lg, y) for c, lg in zip(weights, logits, strict=False))
    got = nested_cross_entropy([torch.from_numpy(lg) for lg in logits], torch.from_numpy(y), weights)
    assert got.item() == pytest.approx(expected, rel=1e-12)
    unweighted = nested_cross_entropy([torch.from_numpy(lg) for lg in logits], torch.from_numpy(y))
    assert unweighted.item() == pytest.approx(sum(cross_entropy(lg, y) for lg in logits), rel=1e-12)


def test_efficient_gradient_skips_columns_beyond_largest_prefix():
    head = MatryoshkaHead(20, 4, [5, 10])
    z = torch.randn(8, 20)
    nested_cross_entropy(head(z), torch.randint(0, 4, (8,))).backward()
    assert torch.equal(head.shared.weight.grad[:, 10:], torch.zeros(4, 10))


def test_invalid_arguments():
    with pytest.raises(ValueError, match="exceeds the embedding dim"):
        MatryoshkaHead(8, 3, [4, 16])
    with pytest.raises(ValueError):
        MatryoshkaHead(8, 3, [4, 4])
    with pytest.raises(ValueError):
        nested_cross_entropy([torch.zeros(2, 3)], torch.zeros(2, dtype=torch.long), [1.0, 1.0])
