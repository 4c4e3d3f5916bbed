"""Miners: a labelled batch → index tuples (anchor, positive, negative), without autograd (``loss.miner``).

A triplet miner is a :class:`TripletMiner` subclass in a module of this package, registered in :data:`MINERS`
by name (``@MINERS.register("name")``): a new miner is one file here (docs/algorithms.md#triplet-miners). It is
built with its options (``margin``, a :class:`~raydist.losses.distances.Distance`), called on a batch it returns
:class:`Triplets`, and it reports the probability of each negative it drew (:meth:`TripletMiner.skew`: the
sampler skew η). A user's mining function joins through :func:`register_miner` with a :class:`Miner`. The
ranking loss's hardest-negative miner is :mod:`raydist.losses.miners.hardest_negatives`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from raydist.losses.components import Component
from raydist.losses.distances import Distance, get_distance
from raydist.losses.miners.hardest_negatives import HardestNegatives, mine_hardest_negatives
from raydist.losses.noise import sampler_skew
from raydist.losses.ranking_inputs import RankingInputs
from raydist.losses.similarity import l2_normalize
from raydist.registry import Registry, RegistryError


class Triplets(NamedTuple):
    """Index tuples (anchor, positive, negative) into one batch: LongTensors of a common length T."""

    anchors: Tensor
    positives: Tensor
    negatives: Tensor


def check_labels(emb: Tensor, labels: Tensor) -> Tensor:
    """``labels`` on ``emb``'s device; ValueError unless emb is [N, D] and labels a 1-D integer tensor [N]."""
    if emb.ndim != 2:
        raise ValueError(f"embeddings must be a 2-D tensor [N, D], got shape {tuple(emb.shape)}")
    if (
        not isinstance(labels, Tensor)
        or labels.ndim != 1
        or labels.shape[0] != emb.shape[0]
        or labels.dtype.is_floating_point
        or labels.dtype.is_complex
        or labels.dtype == torch.bool
    ):
        got = (
            f"dtype={labels.dtype}, shape={tuple(labels.shape)}"
            if isinstance(labels, Tensor)
            else type(labels)
        )
        raise ValueError(
            f"labels must be a 1-D integer tensor of length {emb.shape[0]} (one per row), got {got}"
        )
    return labels.to(emb.device)


def label_masks(labels: Tensor) -> tuple[Tensor, Tensor]:
    """``positive[i, j]``: same label and i ≠ j; ``negative[i, j]``: different labels."""
    same = labels.unsqueeze(1) == labels.unsqueeze(0)
    own = torch.eye(labels.shape[0], dtype=torch.bool, device=labels.device)
    return same & ~own, ~same


class TripletMiner(Component):
    """A triplet miner with its options: ``margin`` α (the semi-hard window), ``distance`` (a name or a
    :class:`~raydist.losses.distances.Distance`; ``d`` below) and ``normalize`` (L2-normalise the rows before any
    distance, so raw embeddings and their unit rows give the same triplets; callers whose rows are unit
    already pass False).

    Subclasses give :meth:`mine` and, when they draw at random (``random = True``, from the caller's
    generator), :meth:`negative_probabilities`. Positive pair (a, p): ``label[a] = label[p]``, a ≠ p; negative n
    of a: ``label[n] ≠ label[a]``. Ties go to the lowest index; an anchor without a positive or a negative
    yields no triplet, and an empty result is valid (the losses then give a zero)."""

    random: ClassVar[bool] = False  # draws from the generator (seeded the same on every rank)

    def __init__(
        self, *, margin: float = 0.2, distance: str | Distance = "euclidean", normalize: bool = True
    ):
        self.margin, self.distance, self.normalize = margin, get_distance(distance), normalize

    def rows(self, emb: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """Checked ``(rows, labels)``: the rows L2-normalised when :attr:`normalize`."""
        labels = check_labels(emb, labels)
        return (l2_normalize(emb) if self.normalize else emb), labels

    @torch.no_grad()
    def __call__(self, emb: Tensor, labels: Tensor, generator: torch.Generator | None = None) -> Triplets:
        """The triplets of a batch ``emb`` [N, D] with integer ``labels`` [N] (random draws from ``generator``:
        equal generator states give equal triplets)."""
        emb, labels = self.rows(emb, labels)
        return self.mine(emb, labels, generator)

    def mine(self, emb: Tensor, labels: Tensor, generator: torch.Generator | None) -> Triplets:
        """The triplets of checked rows (:meth:`rows`)."""
        raise NotImplementedError

    @torch.no_grad()
    def probabilities(self, emb: Tensor, labels: Tensor, triplets: Triplets) -> Tensor:
        """``P(n | a, p)`` [T]: the probability that this miner drew each triplet's negative for its pair (1 for
        a deterministic miner)."""
        emb, labels = self.rows(emb, labels)
        if not self.random:
            return torch.ones(triplets.anchors.shape[0], dtype=emb.dtype, device=emb.device)
        return self.negative_probabilities(emb, labels, triplets)

    def negative_probabilities(self, emb: Tensor, labels: Tensor, triplets: Triplets) -> Tensor:
        """``P(n | a, p)`` [T] of a random miner, on checked rows (:meth:`rows`)."""
        raise NotImplementedError

    def skew(self, emb: Tensor, labels: Tensor, triplets: Triplets) -> float | None:
        """The sampler skew η₋ of the drawn negatives against uniform 1-1 sampling
        (:func:`raydist.losses.noise.sampler_skew`: the mean over triplets of the anchor's number of
        candidate negatives times :meth:`probabilities`); None for no triplet."""
        if triplets.anchors.numel() == 0:
            return None
        probs = self.probabilities(emb, labels, triplets)
        labels = labels.to(emb.device)
        candidates = (labels.unsqueeze(0) != labels[triplets.anchors].unsqueeze(1)).sum(1)
        return sampler_skew(probs.cpu(), candidates.cpu())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(margin={self.margin}, distance={self.distance!r})"


class PairMiner(TripletMiner):
    """A miner that picks one negative per positive pair (a, p) among weighted candidates: subclasses give
    :meth:`negative_weights` (``[M, N]``, 0 = not a candidate); a pair without a candidate is dropped. A random
    miner draws n with probability ∝ weight (one ``torch.multinomial`` over the pairs, in pair order, on the
    generator's device, so a CPU generator serves CUDA embeddings too); a deterministic one takes the closest
    candidate."""

    def negative_weights(
        self, emb: Tensor, dist: Tensor, negative: Tensor, anchors: Tensor, positives: Tensor
    ) -> Tensor:
        """``[M, N]`` weights of each negative n for each pair (anchors[i], positives[i])."""
        raise NotImplementedError

    def _weights(
        self, emb: Tensor, labels: Tensor, anchors: Tensor, positives: Tensor
    ) -> tuple[Tensor, Tensor]:
        dist = self.distance.pairwise(emb, emb)
        return dist, self.negative_weights(emb, dist, label_masks(labels)[1], anchors, positives)

    def mine(self, emb: Tensor, labels: Tensor, generator: torch.Generator | None) -> Triplets:
        anchors, positives = label_masks(labels)[0].nonzero(as_tuple=True)
        dist, weights = self._weights(emb, labels, anchors, positives)
        drawn = weights.sum(1) > 0
        anchors, positives, weights = anchors[drawn], positives[drawn], weights[drawn]
        if not self.random:
            negatives = dist[anchors].masked_fill(weights == 0, torch.inf).argmin(1)
        else:
            draw_device = weights.device if generator is None else generator.device
            draws = torch.multinomial(weights.to(draw_device), 1, generator=generator)
            negatives = draws.squeeze(1).to(emb.device)
        return Triplets(anchors, positives, negatives)

    def negative_probabilities(self, emb: Tensor, labels: Tensor, triplets: Triplets) -> Tensor:
        """``w(a, p, n) / Σ_{n'} w(a, p, n')`` of each triplet."""
        anchors, positives, negatives = triplets
        weights = self._weights(emb, labels, anchors, positives)[1]
        rows = torch.arange(anchors.shape[0], device=emb.device)
        return weights[rows, negatives] / weights.sum(1)


def _check_miner(name: str, miner: Any) -> None:
    """A :class:`TripletMiner` subclass or a :class:`Miner`; either learns its registered name."""
    if isinstance(miner, type) and issubclass(miner, TripletMiner):
        miner.name = name
    elif isinstance(miner, Miner):
        object.__setattr__(miner, "name", name)
    else:
        raise RegistryError(
            f"miner {name!r}: expected a TripletMiner subclass or a raydist.losses.Miner, got {miner!r}"
        )


MINERS: Registry[Any] = Registry("miner", check=_check_miner, package=__name__)


def get_miner(
    name: str, *, margin: float = 0.2, distance: str | Distance = "euclidean", normalize: bool = True
) -> TripletMiner:
    """The miner registered as ``name`` built with its options (unknown: a ValueError naming the close ones)."""
    return MINERS.get(name)(margin=margin, distance=distance, normalize=normalize)


@dataclass(frozen=True)
class Miner:
    """A user's mining function as a registered miner: ``mine(emb, labels, *, margin, distance, generator)``
    returns the :class:`Triplets` of unit rows (``distance`` is the distance's name); ``random``: it draws
    from ``generator``; ``probabilities`` (optional, the same arguments without the generator plus the
    triplets' index tensors): ``P(n | a, p)`` of the drawn negatives, for the sampler skew. Built with the
    options like a :class:`TripletMiner` class."""

    mine: Callable[..., Triplets]
    random: bool = False
    probabilities: Callable[..., Tensor] | None = None

    def __post_init__(self) -> None:  # the registry names the module of the mining function
        object.__setattr__(
            self, "__module__", getattr(getattr(self.mine, "func", self.mine), "__module__", "?")
        )

    def __call__(
        self, *, margin: float = 0.2, distance: str | Distance = "euclidean", normalize: bool = True
    ) -> TripletMiner:
        return _FunctionMiner(self, margin=margin, distance=distance, normalize=normalize)


class _FunctionMiner(TripletMiner):
    """A :class:`Miner`'s function with its options; rows are passed as given (the function's own business)."""

    def __init__(self, spec: Miner, **options: Any) -> None:
        super().__init__(**options)
        self.spec, self.random = spec, spec.random
        self.name = getattr(spec, "name", None) or getattr(spec.mine, "__name__", "function")

    @torch.no_grad()
    def __call__(self, emb: Tensor, labels: Tensor, generator: torch.Generator | None = None) -> Triplets:
        return self.spec.mine(
            emb, labels, margin=self.margin, distance=self.distance.name, generator=generator
        )

    def skew(self, emb: Tensor, labels: Tensor, triplets: Triplets) -> float | None:
        return None if self.spec.probabilities is None else super().skew(emb, labels, triplets)

    @torch.no_grad()
    def probabilities(self, emb: Tensor, labels: Tensor, triplets: Triplets) -> Tensor:
        return self.spec.probabilities(
            emb, labels, *triplets, margin=self.margin, distance=self.distance.name
        )


def register_miner(name: str, miner: type[TripletMiner] | Miner) -> Any:
    """Register ``miner`` (a :class:`TripletMiner` subclass, or a user's function as a :class:`Miner`) as
    ``loss.miner=name``."""
    return MINERS.register(name, miner)


__all__ = [
    "MINERS",
    "HardestNegatives",
    "Miner",
    "PairMiner",
    "RankingInputs",
    "TripletMiner",
    "Triplets",
    "check_labels",
    "get_miner",
    "label_masks",
    "mine_hardest_negatives",
    "register_miner",
]
