"""Gradient clustering (Faghri et al. 2020, docs/algorithms.md#gradient-clustering) as a training-loop
component: A-step on every captured batch, U-step per window, centres identical on all workers, checkpoint
state.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn

from raydist.distributed.gather import global_rank, world_size
from raydist.distributed.reduce import all_reduce_sum
from raydist.gradclust.centres import (
    PreparedCentres,
    RankOneCentres,
    StackedBuffers,
    batch_terms,
    centre_sq_norms,
    distances_from,
    picked,
    stackable,
    update_factors,
)
from raydist.gradclust.layers import Factors, LayerCapture, factor_shape, has_bias, scan_layers

MODES = ("online", "batch")
PENDING_BATCHES = 32  # batches of assignments kept before _fold (bounds the memory in batch mode)


def _sum_over_workers(parts: list[Tensor]) -> Iterator[Tensor]:
    """Each part summed over all ranks with one all-reduce (packed as float64), in its own shape and dtype;
    one worker: the parts themselves (the float64 round trip would be the identity)."""
    if world_size() == 1:
        yield from parts
        return
    flat = all_reduce_sum(torch.cat([p.reshape(-1).double() for p in parts]))
    for part, chunk in zip(parts, flat.split([p.numel() for p in parts]), strict=False):
        yield chunk.view(part.shape).to(part.dtype)


class GradientClustering:
    """K clusters of per-example gradients ``g_i`` (the supported layers' weight and bias gradients).

    Exact definition (the tests hold the code to it):

    * Centres: per layer ``C_k = d_k c_kᵀ`` (rank 1, d_k [n_out], c_k [n_in], bias = last input column).
    * Seeding (first :meth:`after_backward`): K distinct rows r_k of the global batch (rows numbered in rank
      order) from ``randperm`` of the seeded generator; ``c_k = Σ_p u_{r_k p}``, ``d_k = G_{r_k} c_k/‖c_k‖²``
      (exactly ``g_{r_k}`` when the layer has one position).
    * A-step (every :meth:`after_backward`): ``a_i = argmin_k (N_k+1)‖C_k − g_i‖²`` with N the counts
      of the last U-step (0 before the first); the window keeps ``n_k``, ``D_k = Σ_{i∈k}‖C_k − g_i‖²``
      and the factor sums of the U-step to come.
    * U-step number u (0, 1, …) holds one factor and solves least squares for the other: input factors
      when u is even, output factors when u is odd, e.g.
      ``c_k ← argmin_c γN_k‖d_k cᵀ − C_k‖² + Σ_{i∈k, window}‖d_k cᵀ − g_i‖²``; then
      ``N_k ← γN_k + n_k``, ``D̄_k ← γD̄_k + D_k``. A rank-1 centre cannot always equal the cluster mean
      (a mean of rank-1 gradients is not rank 1); this is the least-squares rank-1 centre with one factor
      held, and it equals the mean after two U-steps when the mean is rank 1 (e.g. identical gradients).
      ``online``: γ = ``decay``, a U-step after every ``update_every`` batches. ``batch``: γ = 0, the
      loop calls :meth:`update` once per pass, so ``N_k`` are the pass's counts and the fit is to the
      pass mean ``M_k`` (``c_k = M_kᵀ d_k/‖d_k‖²``).
    * Reported after each U-step: ``objective = Σ_k N_k D̄_k`` (the ``Σ_k N_k Σ_{i∈k}‖C_k − g_i‖²`` of
      docs/algorithms.md#gradient-clustering for a batch-mode pass, with the centres the pass was
      assigned to) and ``total_distortion = Σ_k D̄_k``.
    * Re-seeding (after each U-step): for each k in order with ``N_k < min_cluster_size``, the cluster m
      with the largest ``D̄_m > 0`` among those with ``N_m ≥ 2·min_cluster_size`` is split: for every layer
      ``r = split_noise·‖c_m‖·z/‖z‖`` (z standard normal from the generator), ``c_k = c_m + r``,
      ``c_m ← c_m − r``, ``d_k = d_m``; ``N_k = N_m ← N_m/2``, ``D̄_k = D̄_m ← D̄_m/2``.
    * Sharding: each worker assigns its own rows with the shared centres; the window statistics are summed
      over workers (one all-reduce per U-step), so every worker computes identical centres. Every worker
      must call :meth:`after_backward` and :meth:`update` equally often.

    Layers listed by :func:`~raydist.gradclust.layers.unsupported_layers` are excluded (``self.excluded``,
    with a warning).

    In a training loop (the loss backpropagated is ``loss_scale · Σ_i ℓ_i``, a SUM over this worker's rows;
    e.g. loss_scale = 1/B for a mean, or the AMP scaler's scale)::

        with gc.capture():
            loss = loss_fn(model(x), y)
        loss.backward()
        gc.after_backward(sample_ids, loss_scale=1.0)  # any time before the next capture
        optimizer.step()
        # batch mode: gc.update() after each pass on every worker; checkpoints: gc.state_dict()

    Losses that are not sums of per-example terms (the pairs task's ranking loss, the labels task's triplet
    and margin losses: a row's term depends on other rows): backpropagate the loss itself (loss_scale = 1,
    :meth:`raydist.tasks.Task.row_loss_scale`). What the hooks record for row i is then its *contribution*,
    the gradient of the batch loss that flows through row i's activations (∂L/∂(row i's outputs) propagated
    through row i's own forward); the contributions sum to the batch gradient, and ``g_i`` above is row
    i's contribution (tests/test_gradclust_rows.py checks both against autograd in float64). Clustering
    contributions, and stratifying batches by them, is a heuristic: a contribution changes with the rest of
    the batch, and the sampler's weights make ``Σ_i w_i ℓ_i / B`` unbiased only for a sum of per-example
    losses (``gc.sample`` scales each row's contribution by its weight there: a documented heuristic).

    Per step the A-step costs two skinny matrix products, two row norms and one U-step product per layer
    plus about fifteen ops for the whole batch, in inference mode: Linear layers on [B, n] inputs are stacked
    (:func:`~raydist.gradclust.centres.batch_terms`: their projections land in reused [L, K, B] tensors, so
    the cross terms, ‖G_i‖², the mask and the bias sums are one op each for all of them); the centre
    layouts, ``Σ_l ‖C_lk‖²`` and ``N_k + 1`` are computed once per centre change; the window's counts,
    distortion and per-sample assignments are folded in once per U-step (or every :data:`PENDING_BATCHES`
    batches), not per batch.
    """

    def __init__(
        self,
        model: nn.Module,
        num_clusters: int,
        *,
        mode: str = "online",
        decay: float | None = None,
        update_every: int = 10,
        min_cluster_size: float = 1.0,
        split_noise: float = 0.01,
        seed: int = 0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "batch" and decay:
            raise ValueError("batch mode has no decay: each pass replaces the statistics")
        self.decay = 0.0 if mode == "batch" else (0.5 if decay is None else float(decay))
        if not 0.0 <= self.decay < 1.0 or num_clusters < 1 or update_every < 1:
            raise ValueError("need 0 <= decay < 1, num_clusters >= 1, update_every >= 1")
        layers, self.excluded = scan_layers(model)
        if not layers:
            raise ValueError("no layer of the model can be clustered")
        if self.excluded:
            warnings.warn(f"gradient clustering excludes {self.excluded}", stacklevel=2)
        self.mode, self.num_clusters, self.update_every = mode, num_clusters, update_every
        self.min_cluster_size, self.split_noise, self.seed = min_cluster_size, split_noise, seed
        self._capture = LayerCapture(layers)
        self._weights = {name: module.weight for name, module in layers.items()}
        self._names = list(layers)
        self._one_dtype = len({w.dtype for w in self._weights.values()}) == 1
        self._shapes = {name: factor_shape(module) for name, module in layers.items()}
        self._bias = {name: not isinstance(m, nn.Embedding) and has_bias(m) for name, m in layers.items()}
        device = next(iter(self._weights.values())).device
        self.centres: dict[str, RankOneCentres] = {}  # change only through seeding, update, load
        self._centre_sq = torch.zeros(num_clusters, dtype=torch.float64, device=device)  # Σ_l ‖C_lk‖²
        self._prepared: dict[str, PreparedCentres] = {}  # the centres laid out for batch_terms
        self._buffers = StackedBuffers()
        self.counts = torch.zeros(num_clusters, dtype=torch.float64, device=device)
        self._assign_weight = (self.counts + 1).unsqueeze(0)  # the A-step's (N_k + 1), [1, K]
        self._cluster_ids = torch.arange(num_clusters, device=device)
        self._cluster_ids_3d = self._cluster_ids.view(-1, 1, 1)  # k as [K, 1, 1] for the stacked mask
        self.distortion = torch.zeros_like(self.counts)
        self.objective = 0.0
        self.total_distortion = 0.0
        self.steps = self.updates = self.reseeds = 0
        self._generator = torch.Generator().manual_seed(seed)
        # each sample id's latest cluster: the (ids, clusters) batches logged since the last _compact, then the
        # compacted map (ids sorted and unique, their clusters), all on the CPU
        self._assign_log: list[tuple[Tensor, Tensor]] = []
        self._log_rows = 0
        self._assigned_ids = torch.zeros(0, dtype=torch.long)
        self._assigned = torch.zeros(0, dtype=torch.long)
        # per-batch (assignment [B], distances [B, K], sample ids or None), folded into the window's
        # counts and distortion and into _assignments in one go by _fold (fewer ops per batch)
        self._pending: list[tuple[Tensor, Tensor, Tensor | None]] = []
        self._reset_window()

    @property
    def layers(self) -> list[str]:
        """Names of the clustered layers."""
        return list(self._shapes)

    @property
    def updating_inputs(self) -> bool:
        """Whether the next U-step solves for the input factors c (else the output factors d)."""
        return self.updates % 2 == 0

    def capture(self) -> AbstractContextManager[None]:
        """Context for the forward pass: records layer inputs and hooks their output gradients."""
        return self._capture.recording()

    def attach(self) -> None:
        """Register the clustered layers' forward hooks now (else the first :meth:`capture` does); they stay
        until :meth:`detach`, and a forward outside a capture pays one flag check per layer."""
        self._capture.attach()

    def detach(self) -> None:
        """Remove the layers' forward hooks: the model runs as if GC were not attached (the next
        :meth:`capture` attaches them again)."""
        self._capture.detach()

    def after_backward(self, sample_ids: Tensor | None = None, *, loss_scale: float = 1.0) -> Tensor:
        """A-step on the captured batch (backward of ``loss_scale · Σ_i ℓ_i`` done); U-step when due.

        Returns the assignments a [B]; with ``sample_ids`` [B] they are also kept for the sampler.
        """
        # The captured tensors are not detached: nothing here may record a graph. The per-batch work runs in
        # inference mode (its ops skip autograd's bookkeeping); everything made there is temporary or added
        # into state made outside it, by ops outside it (seeding, folding and U-steps run under no_grad).
        with torch.inference_mode():
            factors = self._capture.factors(loss_scale)
            assignment = self._a_step(factors, sample_ids) if self.centres else None
        if assignment is None:  # the first batch seeds the centres
            with torch.no_grad():
                self._seed(factors)
            with torch.inference_mode():
                assignment = self._a_step(factors, sample_ids)
        assignment = assignment.clone()  # a normal tensor for the caller (not an inference tensor)
        self.steps += 1
        due = self.mode == "online" and self.steps % self.update_every == 0
        if due:
            with torch.no_grad():
                self.update()
        elif len(self._pending) >= PENDING_BATCHES:
            with torch.no_grad():
                self._fold()
        return assignment

    def _a_step(self, factors: dict[str, Factors], sample_ids: Tensor | None) -> Tensor:
        # the distances of centres.squared_distances and the A-step of centres.assign, with the centre
        # layouts, ‖C_k‖² and (N_k + 1) computed once per centre change (_centres_changed), not per batch
        terms = batch_terms(factors, self._prepared, self._stacked(factors), self._buffers)
        distances = distances_from(terms.cross, terms.grad_sq, self._centre_sq)
        column = torch.argmin(self._assign_weight * distances, dim=1, keepdim=True)  # a_i as [B, 1]
        ids = None if sample_ids is None else sample_ids.clone()  # the caller may reuse or modify these
        self._pending.append((column, distances, ids))
        # U-step sums: coeff_(ip)k = proj_(ip)k in the column k = a_i, 0 elsewhere (one mask for all layers)
        inputs = self.updating_inputs
        if terms.buffers is not None:
            buffers = terms.buffers
            coeff, rows = (
                (buffers.grad_coeff, buffers.grad_rows)
                if inputs
                else (buffers.input_coeff, buffers.input_rows)
            )
            coeff.mul_(torch.eq(column.view(1, 1, -1), self._cluster_ids_3d))  # [K, L, B] by [K, 1, B]
            for layer, name in enumerate(terms.stacked):
                if inputs:
                    self._sum_parts[name][0].addmm_(rows[layer], factors[name].flat_inputs)
                else:
                    self._sums[name].addmm_(rows[layer], factors[name].flat_grads)
            if inputs and self._stacked_bias is not None:  # bias columns Σ_i coeff_kli, added in _fold
                self._stacked_bias.view(-1).addmv_(buffers.grad_coeff_flat, buffers.ones)
        if terms.projections:
            mask = column == self._cluster_ids  # [B, K] bool
        for name, (grad_proj, input_proj) in terms.projections.items():
            f, proj = factors[name], grad_proj if inputs else input_proj
            if f.positions == 1:
                coeff = proj * mask
            else:
                coeff = (proj.view(f.batch_size, f.positions, -1) * mask.unsqueeze(1)).view(proj.shape)
            if inputs:
                main, bias = self._sum_parts[name]
                f.add_masked_input_sums(main, coeff, bias)
            else:
                f.add_masked_grad_sums(self._sums[name], coeff)
        return column.view(-1)

    def update(self) -> None:
        """U-step from the window's statistics summed over workers, then re-seeding; opens a new window."""
        if not self.centres:
            raise RuntimeError("update() before any after_backward()")
        names = self.layers
        self._fold()
        counts, distortion, *sums = _sum_over_workers(
            [self._window_counts, self._window_distortion] + [self._sums[n] for n in names]
        )
        prior = self.decay * self.counts
        total = prior + counts
        centres = [self.centres[name] for name in names]
        inputs = self.updating_inputs
        for centre, factor in zip(
            centres, update_factors(centres, sums, prior, total, inputs=inputs), strict=False
        ):
            if inputs:
                centre.c = factor
            else:
                centre.d = factor
        self.counts = total
        self.distortion = self.decay * self.distortion + distortion
        self.objective = float((self.counts * self.distortion).sum())
        self.total_distortion = float(self.distortion.sum())
        self._reseed()
        self._centres_changed()
        self.updates += 1
        self._reset_window()

    def assignments(self, sample_ids: Tensor) -> Tensor:
        """Last cluster of each sample id seen by this worker's :meth:`after_backward`; −1 if never seen."""
        self._fold()
        self._compact()
        known, ids = self._assigned_ids, sample_ids.reshape(-1).cpu().long()
        if not len(known):
            return torch.full_like(ids, -1)
        pos = torch.searchsorted(known, ids).clamp_(max=len(known) - 1)
        return torch.where(known[pos] == ids, self._assigned[pos], -1)

    def _fold(self) -> None:
        """Add the pending batches to the window's counts and distortion (``n_k``, ``D_k``) and to the
        per-sample assignments, in batch order (a later batch's assignment of a sample id wins)."""
        self._flush_bias()
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        column = torch.cat([a for a, _, _ in pending])  # [ΣB, 1]
        own = torch.cat([d for _, d, _ in pending]).gather(1, column).squeeze(1)
        assignment = column.squeeze(1)
        self._window_counts += torch.bincount(assignment, minlength=self.num_clusters)
        self._window_distortion.index_add_(0, assignment, own)
        for a, _, ids in pending:
            if ids is not None:
                self._assign_log.append((ids, a.view(-1)))
                self._log_rows += len(a)
        if self._log_rows > max(2 * len(self._assigned_ids), 1 << 16):
            self._compact()

    def _compact(self) -> None:
        """Merge the logged assignments into the sorted map; a later batch's cluster for an id wins (a stable
        sort keeps each id's entries in log order)."""
        if not self._assign_log:
            return
        log, self._assign_log, self._log_rows = self._assign_log, [], 0
        ids = torch.cat([self._assigned_ids] + [i.reshape(-1).cpu().long() for i, _ in log])
        clusters = torch.cat([self._assigned] + [a.cpu() for _, a in log])
        ids, order = torch.sort(ids, stable=True)
        clusters = clusters[order]
        last = torch.ones_like(ids, dtype=torch.bool)
        last[:-1] = ids[1:] != ids[:-1]
        self._assigned_ids, self._assigned = ids[last], clusters[last]

    def _reset_window(self) -> None:
        self._window_counts = torch.zeros_like(self.counts)
        self._window_distortion = torch.zeros_like(self.counts)
        side = 1 if self.updating_inputs else 0
        sums = {
            n: self._weights[n].new_zeros(self.num_clusters, shape[side]) for n, shape in self._shapes.items()
        }
        self._set_sums(sums)

    def _set_sums(self, sums: dict[str, Tensor]) -> None:
        """The window's factor sums, and for input sums of layers with a bias the views (inputs' part,
        bias column) that ``add_masked_input_sums`` adds to."""
        self._sums = sums
        self._stacked_bias: Tensor | None = (
            None  # bias-column sums of the stacked layers, [K, L] (see _stacked)
        )
        self._stacked_bias_names: list[str] = []
        self._sum_parts = {
            name: (s[:, :-1], s[:, -1]) if self._bias[name] and self.updating_inputs else (s, None)
            for name, s in sums.items()
        }

    def _stacked(self, factors: dict[str, Factors]) -> list[str]:
        """The layers whose terms are computed stacked this batch (:func:`stackable`); a window that updates
        input factors keeps their bias-column sums in one [K, L] tensor, added to the sums by :meth:`_fold`."""
        # every layer a Linear on [B, n] in its weight's dtype, one dtype for all: stackable's answer is all layers
        names = self._names if self._capture.all_flat and self._one_dtype else stackable(factors, self._names)
        if names != self._stacked_bias_names:
            self._flush_bias()
            self._stacked_bias_names = names
            biased = self.updating_inputs and any(self._bias[n] for n in names)
            self._stacked_bias = (
                self._sums[names[0]].new_zeros(self.num_clusters, len(names)) if biased else None
            )
        return names

    def _flush_bias(self) -> None:
        if self._stacked_bias is None:
            return
        for column, name in zip(self._stacked_bias.T, self._stacked_bias_names, strict=False):
            if self._bias[name]:
                self._sums[name][:, -1] += column
        self._stacked_bias = torch.zeros_like(self._stacked_bias)  # (the old one may be an inference tensor)

    def _seed(self, factors: dict[str, Factors]) -> None:
        batch = next(iter(factors.values())).batch_size
        sizes = torch.zeros(world_size(), dtype=torch.float64, device=self.counts.device)
        sizes[global_rank()] = batch
        sizes = all_reduce_sum(sizes).long().tolist()
        offset, total = sum(sizes[: global_rank()]), sum(sizes)
        if total < self.num_clusters:
            raise ValueError(f"the first global batch ({total} rows) is smaller than K={self.num_clusters}")
        rows = torch.randperm(total, generator=self._generator)[: self.num_clusters].to(self.counts.device)
        mine = (rows >= offset) & (rows < offset + batch)
        slots, local = mine.nonzero().squeeze(1), rows[mine] - offset
        parts = []
        for name in self.layers:
            f = factors[name].select(local)
            n_out, n_in = self._shapes[name]
            c, d = f.grads.new_zeros(self.num_clusters, n_in), f.grads.new_zeros(self.num_clusters, n_out)
            f.add_input_sums(c, f.grads.new_ones(f.grads.shape[:2]), slots)
            c_sq = c.square().sum(1, keepdim=True)
            f.add_grad_sums(d, picked(f.input_proj(c), slots), slots)
            parts += [d / torch.where(c_sq > 0, c_sq, torch.ones_like(c_sq)), c]
        seeded = list(_sum_over_workers(parts))
        self.centres = {n: RankOneCentres(*seeded[2 * j : 2 * j + 2]) for j, n in enumerate(self.layers)}
        self._centres_changed()

    def _centres_changed(self) -> None:
        """Everything the per-batch A-step derives from the centres and counts (called after each change)."""
        self._centre_sq = centre_sq_norms(list(self.centres.values()))
        self._prepared = {
            name: PreparedCentres.of(self.centres[name], self._bias[name]) for name in self.layers
        }
        self._assign_weight = (self.counts + 1).unsqueeze(0)

    def _reseed(self) -> None:
        # a split halves a donor's N_m ≥ 2·min_cluster_size, so the set of small clusters is fixed up front
        for k in (self.counts < self.min_cluster_size).nonzero().flatten().tolist():
            donors = (self.counts >= 2 * self.min_cluster_size) & (self.distortion > 0)
            if not donors.any():
                return
            m = int(torch.where(donors, self.distortion, -torch.inf).argmax())
            for centre in (self.centres[name] for name in self.layers):
                z = torch.randn(centre.c.shape[1], generator=self._generator, dtype=torch.float64)
                r = (self.split_noise * z / z.norm()).to(centre.c) * centre.c[m].norm()
                centre.c[k], centre.c[m] = centre.c[m] + r, centre.c[m] - r
                centre.d[k] = centre.d[m]
            self.counts[k] = self.counts[m] = self.counts[m] / 2
            self.distortion[k] = self.distortion[m] = self.distortion[m] / 2
            self.reseeds += 1

    def state_dict(self) -> dict[str, Any]:
        """Centres, counts, the open window, this worker's assignments (by sample id), generator and
        counters. Centres are identical on all workers; the assignments are this worker's own."""
        self._fold()
        self._compact()
        return {
            "num_clusters": self.num_clusters,
            "mode": self.mode,
            "layers": self.layers,
            "centres": {n: {"d": c.d.clone(), "c": c.c.clone()} for n, c in self.centres.items()},
            "counts": self.counts.clone(),
            "distortion": self.distortion.clone(),
            "objective": self.objective,
            "total_distortion": self.total_distortion,
            "window": {
                "counts": self._window_counts.clone(),
                "distortion": self._window_distortion.clone(),
                "sums": {n: s.clone() for n, s in self._sums.items()},
            },
            "assignments": {"sample_ids": self._assigned_ids.clone(), "clusters": self._assigned.clone()},
            "generator": self._generator.get_state(),
            "counters": {"steps": self.steps, "updates": self.updates, "reseeds": self.reseeds},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the clustering continues exactly as the saved one would."""
        saved = (state["num_clusters"], state["mode"], state["layers"])
        if saved != (self.num_clusters, self.mode, self.layers):
            raise ValueError(f"checkpoint is for (K, mode, layers) = {saved}")
        device = self.counts.device
        self.centres = {
            n: RankOneCentres(c["d"].to(self._weights[n], copy=True), c["c"].to(self._weights[n], copy=True))
            for n, c in state["centres"].items()
        }
        self.counts = state["counts"].to(device, torch.float64, copy=True)
        self._assign_weight = (self.counts + 1).unsqueeze(0)
        self.distortion = state["distortion"].to(device, torch.float64, copy=True)
        self.objective, self.total_distortion = state["objective"], state["total_distortion"]
        counters = state["counters"]
        self.steps, self.updates, self.reseeds = counters["steps"], counters["updates"], counters["reseeds"]
        window = state["window"]
        self._pending = []
        self._window_counts = window["counts"].to(device, torch.float64, copy=True)
        self._window_distortion = window["distortion"].to(device, torch.float64, copy=True)
        self._set_sums({n: s.to(self._weights[n], copy=True) for n, s in window["sums"].items()})
        ids, order = torch.sort(state["assignments"]["sample_ids"].cpu().long())
        self._assign_log, self._log_rows = [], 0
        self._assigned_ids, self._assigned = ids, state["assignments"]["clusters"].cpu().long()[order]
        self._generator.set_state(state["generator"])
        if self.centres:
            self._centres_changed()
