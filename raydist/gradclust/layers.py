"""Per-layer factors of per-example gradients, recorded with forward hooks (inputs) and tensor hooks on
layer outputs (output gradients δ); which layers can be factored and which are listed as unsupported.

Every supported layer's per-example weight gradient (bias folded in as an implicit input column of ones) is
``G_i = Σ_p δ_ip u_ipᵀ`` over positions p: one position for a Linear on [B, in], the T steps of a Linear on
[B, T, in], the output pixels of a Conv2d (u = unfolded patch), the tokens of an Embedding (u = one-hot).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property, partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SUPPORTED = (nn.Linear, nn.Conv2d, nn.Embedding)


def gram_is_cheaper(positions: int, n_in: int, n_out: int) -> bool:
    """Whether ``‖G‖² = Σ_{p,q} (u_p·u_q)(δ_p·δ_q)`` (P²(n_in+n_out+1) flops per example) beats forming
    ``G = Σ_p δ_p u_pᵀ`` and squaring it (P·n_in·n_out + n_in·n_out flops); always true for P = 1."""
    return positions * positions * (n_in + n_out + 1) <= positions * n_in * n_out + n_in * n_out


def _add_cluster_sums(out: Tensor, values: Tensor, weights: Tensor, index: Tensor) -> None:
    """``out_k += Σ_{i: index_i = k} Σ_p w_ip v_ip`` as one product [K, B·P] @ [B·P, n]."""
    batch, positions, width = values.shape
    coeff = weights.new_zeros(out.shape[0], batch, positions)
    coeff[index, torch.arange(batch, device=index.device)] = weights
    out.addmm_(coeff.view(out.shape[0], -1), values.reshape(batch * positions, width))


class Factors(ABC):
    """Per-example gradients ``G_i = Σ_p δ_ip u_ipᵀ`` of one layer, never formed; ``grads``: δ [B,P,n_out].

    Two interfaces: the reference one (:meth:`grad_proj`, :meth:`input_proj`, :meth:`add_grad_sums`,
    :meth:`add_input_sums`: centre factors as [K, n], results [B, P, K], cluster sums from per-example
    weights and indices) and the per-step one of :class:`~raydist.gradclust.GradientClustering`
    (``*_t`` / ``add_masked_*``: transposed centre factors [n, K] laid out once per centre change, results
    flat [B·P, K], cluster sums from masked coefficients), which does the same sums in fewer ops.
    """

    grads: Tensor

    @property
    def batch_size(self) -> int:
        return self.grads.shape[0]

    @property
    def positions(self) -> int:
        return self.grads.shape[1]

    @cached_property
    def flat_grads(self) -> Tensor:
        """δ as [B·P, n_out]."""
        return self.grads.reshape(-1, self.grads.shape[2])

    def grad_proj(self, d: Tensor) -> Tensor:
        """``δ_ip · d_k`` → [B, P, K] for output factors d [K, n_out]."""
        return self.grads @ d.T

    def add_grad_sums(self, out: Tensor, weights: Tensor, index: Tensor) -> None:
        """``out_k += Σ_{i: index_i = k} Σ_p w_ip δ_ip`` for out [K, n_out], weights [B, P]."""
        _add_cluster_sums(out, self.grads, weights, index)

    def grad_proj_t(self, d_t: Tensor) -> Tensor:
        """``δ_ip · d_k`` → [B·P, K] from the transposed factors ``d_t = dᵀ`` [n_out, K]: one product."""
        return torch.mm(self.flat_grads, d_t)

    def add_masked_grad_sums(self, out: Tensor, coeff: Tensor) -> None:
        """``out_k += Σ_{i,p} coeff_(ip)k δ_ip`` for out [K, n_out] and coeff [B·P, K] (each example's
        weights in its own cluster's column, zero elsewhere): one product [K, B·P] @ [B·P, n_out]."""
        out.addmm_(coeff.T, self.flat_grads)

    @abstractmethod
    def input_proj(self, c: Tensor) -> Tensor:
        """``u_ip · c_k`` → [B, P, K] for input factors c [K, n_in]."""

    @abstractmethod
    def input_proj_t(self, c_t: Tensor, c_bias: Tensor | None = None) -> Tensor:
        """``u_ip · c_k`` → [B·P, K] from the transposed factors ``c_t = cᵀ`` [n_in, K] (contiguous), or, for
        a dense layer with a bias, ``c_t`` = the rows of the inputs [n, K] and ``c_bias`` the bias row [K]."""

    @abstractmethod
    def add_masked_input_sums(self, out: Tensor, coeff: Tensor, out_bias: Tensor | None = None) -> None:
        """``out_k += Σ_{i,p} coeff_(ip)k u_ip`` for out [K, n_in] and coeff [B·P, K] as in
        :meth:`add_masked_grad_sums`; for a dense layer with a bias ``out`` is the inputs' part [K, n] and
        ``out_bias`` the bias column [K] (views of the [K, n + 1] sums)."""

    @abstractmethod
    def add_input_sums(self, out: Tensor, weights: Tensor, index: Tensor) -> None:
        """``out_k += Σ_{i: index_i = k} Σ_p w_ip u_ip`` for out [K, n_in], weights [B, P]."""

    @abstractmethod
    def sq_norms(self) -> Tensor:
        """``‖G_i‖²_F`` → [B]."""

    @abstractmethod
    def select(self, rows: Tensor) -> Factors:
        """The factors of examples ``rows`` only."""


class DenseFactors(Factors):
    """Dense inputs a [B, P, n] (Linear, unfolded Conv2d) and δ [B, P, n_out]. With ``bias`` each
    ``u_ip = [a_ip, 1]``; the ones column is implicit (n_in = n + 1), never stored. A Linear on [B, n] passes
    a [B, n] and δ [B, n_out] (one position): they are kept as the flat views, and the [B, 1, n] ones are
    made only if a reference method asks for them (the per-step path reads the flat views)."""

    def __init__(self, inputs: Tensor, grads: Tensor, bias: bool = False) -> None:
        self.bias = bias
        if inputs.dim() == 2:
            self.__dict__.update(flat_inputs=inputs, flat_grads=grads)
            self._shape = (inputs.shape[0], 1)
        else:
            self.__dict__.update(inputs=inputs, grads=grads)
            self._shape = (inputs.shape[0], inputs.shape[1])

    @property
    def batch_size(self) -> int:
        return self._shape[0]

    @property
    def positions(self) -> int:
        return self._shape[1]

    @cached_property
    def inputs(self) -> Tensor:
        """a as [B, P, n]."""
        return self.flat_inputs.unsqueeze(1)

    @cached_property
    def grads(self) -> Tensor:  # type: ignore[override]
        """δ as [B, P, n_out]."""
        return self.flat_grads.unsqueeze(1)

    @cached_property
    def flat_inputs(self) -> Tensor:
        """a as [B·P, n]."""
        return self.inputs.reshape(-1, self.inputs.shape[2])

    def input_proj(self, c: Tensor) -> Tensor:
        if not self.bias:
            return self.inputs @ c.T
        batch, positions, width = self.inputs.shape
        flat = torch.addmm(c[:, -1], self.inputs.reshape(batch * positions, width), c[:, :-1].T)
        return flat.view(batch, positions, -1)

    def add_input_sums(self, out: Tensor, weights: Tensor, index: Tensor) -> None:
        if not self.bias:
            _add_cluster_sums(out, self.inputs, weights, index)
            return
        _add_cluster_sums(out[:, :-1], self.inputs, weights, index)
        out[:, -1].index_add_(0, index, weights.sum(1))

    def input_proj_t(self, c_t: Tensor, c_bias: Tensor | None = None) -> Tensor:
        if c_bias is None:
            return torch.mm(self.flat_inputs, c_t)
        return torch.addmm(c_bias, self.flat_inputs, c_t)

    def add_masked_input_sums(self, out: Tensor, coeff: Tensor, out_bias: Tensor | None = None) -> None:
        out.addmm_(coeff.T, self.flat_inputs)
        if out_bias is not None:
            out_bias += coeff.sum(0)

    def sq_norms(self) -> Tensor:
        """``Σ_{p,q} (u_p·u_q)(δ_p·δ_q)`` (elementwise when P = 1) or ``‖Σ_p δ_p u_pᵀ‖²``, whichever
        :func:`gram_is_cheaper` picks; ``u_p·u_q = a_p·a_q + 1`` with a bias."""
        a, g, bias = self.inputs, self.grads, float(self.bias)
        positions = a.shape[1]
        if positions == 1:  # one read of each; no squared copy
            a_sq = torch.linalg.vector_norm(self.flat_inputs, dim=1).square_()
            g_sq = torch.linalg.vector_norm(self.flat_grads, dim=1).square_()
            return (a_sq.add_(bias) if self.bias else a_sq).mul_(g_sq)
        if gram_is_cheaper(positions, a.shape[2] + self.bias, g.shape[2]):
            return ((torch.bmm(a, a.mT) + bias) * torch.bmm(g, g.mT)).sum((1, 2))
        dense = torch.bmm(g.mT, a).square().sum((1, 2))
        return dense + bias * g.sum(1).square().sum(1)

    def select(self, rows: Tensor) -> DenseFactors:
        return DenseFactors(self.inputs[rows], self.grads[rows], self.bias)


@dataclass
class EmbeddingFactors(Factors):
    """One-hot inputs: token ids [B, P] into ``num_embeddings`` rows (G_i is [dim, num_embeddings])."""

    tokens: Tensor
    grads: Tensor
    num_embeddings: int

    def input_proj(self, c: Tensor) -> Tensor:
        return c[:, self.tokens].permute(1, 2, 0)

    def add_input_sums(self, out: Tensor, weights: Tensor, index: Tensor) -> None:
        flat = (index.unsqueeze(1) * self.num_embeddings + self.tokens).flatten()
        out.view(-1).index_add_(0, flat, weights.flatten())

    def input_proj_t(self, c_t: Tensor, c_bias: Tensor | None = None) -> Tensor:
        return c_t[self.tokens.flatten()]

    def add_masked_input_sums(self, out: Tensor, coeff: Tensor, out_bias: Tensor | None = None) -> None:
        out.T.index_add_(0, self.tokens.flatten(), coeff)

    def sq_norms(self) -> Tensor:
        """``Σ_v ‖Σ_{p: x_ip = v} δ_ip‖²``: δ summed per (example, token id), then squared."""
        batch, positions = self.tokens.shape
        example = torch.arange(batch, device=self.tokens.device).repeat_interleave(positions)
        key = example * self.num_embeddings + self.tokens.flatten()
        keys, inverse = torch.unique(key, return_inverse=True)
        grads = self.grads.reshape(batch * positions, -1)
        per_key = grads.new_zeros(keys.shape[0], grads.shape[1]).index_add_(0, inverse, grads)
        owner = keys // self.num_embeddings
        return grads.new_zeros(batch).index_add_(0, owner, per_key.square().sum(1))

    def select(self, rows: Tensor) -> EmbeddingFactors:
        return EmbeddingFactors(self.tokens[rows], self.grads[rows], self.num_embeddings)


# why the trainable parameters of these torch.nn modules are left out (others: "no per-example gradient factors")
EXCLUDED_REASONS = {
    nn.MultiheadAttention: "attention: in_proj_weight and out_proj are applied functionally, no module hook sees them",
    nn.LayerNorm: "LayerNorm: an elementwise scale and shift, its per-example gradient is not an outer product",
}


def _own_forward(module: nn.Module) -> bool:
    return any(isinstance(module, t) and type(module).forward is t.forward for t in SUPPORTED)


def unsupported_reason(module: nn.Module) -> str | None:
    """Why ``module``'s own trainable parameters cannot be factored; None when they can or there are none."""
    own = [p for p in module.parameters(recurse=False) if p.requires_grad]
    if not own:
        return None
    if not _own_forward(module):
        known = next((why for kind, why in EXCLUDED_REASONS.items() if isinstance(module, kind)), None)
        return known or f"no per-example gradient factors for {type(module).__name__}"
    if not module.weight.requires_grad:
        return "frozen weight with a trainable bias"
    if isinstance(module, nn.Conv2d):
        if module.groups != 1:
            return "Conv2d with groups > 1"
        if module.padding_mode != "zeros" or isinstance(module.padding, str):
            return "Conv2d padding must be numeric zero padding"
    if isinstance(module, nn.Embedding) and module.scale_grad_by_freq:
        return "Embedding with scale_grad_by_freq couples the examples of a batch"
    return None


def scan_layers(model: nn.Module) -> tuple[dict[str, nn.Module], list[tuple[str, str]]]:
    """(clusterable layers by name, [(name, reason)] of layers with trainable parameters left out).

    Modules inside an unsupported ``torch.nn`` module are left out too (its forward may use their weights
    directly, as MultiheadAttention does with ``out_proj``).
    """
    layers: dict[str, nn.Module] = {}
    skipped: list[tuple[str, str]] = []
    opaque: dict[str, str] = {}  # unsupported torch.nn modules (name: type): their submodules are left out
    for name, module in model.named_modules():
        parent = next((o for o in opaque if name.startswith(o + ".")), None)
        if parent is not None:
            if any(p.requires_grad for p in module.parameters(recurse=False)):
                skipped.append(
                    (name, f"inside unsupported {opaque[parent]}, whose forward uses its weights directly")
                )
            continue
        reason = unsupported_reason(module)
        if reason is not None:
            skipped.append((name, reason))
            if type(module).__module__.startswith("torch.nn"):
                opaque[name] = type(module).__name__
        elif any(p.requires_grad for p in module.parameters(recurse=False)):
            layers[name] = module
    return layers, skipped


def unsupported_layers(model: nn.Module) -> list[tuple[str, str]]:
    """``[(module name, reason)]`` for every module whose trainable parameters gradient clustering ignores."""
    return scan_layers(model)[1]


def factor_shape(module: nn.Module) -> tuple[int, int]:
    """``(n_out, n_in)`` of the layer's per-example gradient matrix (n_in counts the bias column)."""
    bias = int(getattr(module, "bias", None) is not None and module.bias.requires_grad)
    if isinstance(module, nn.Linear):
        return module.out_features, module.in_features + bias
    if isinstance(module, nn.Conv2d):
        return module.out_channels, module.weight[0].numel() + bias
    return module.embedding_dim, module.num_embeddings


def _factors(module: nn.Module, x: Tensor, grad: Tensor) -> Factors:
    """Factors in the weight's dtype (under autocast δ may be half precision)."""
    batch, dtype = x.shape[0], module.weight.dtype
    if grad.dtype != dtype:
        grad = grad.to(dtype)
    if isinstance(module, nn.Embedding):
        tokens = x.reshape(batch, -1)
        grads = grad.reshape(batch, tokens.shape[1], -1)
        if module.padding_idx is not None:
            grads = grads * (tokens != module.padding_idx).unsqueeze(2).to(grads.dtype)
        return EmbeddingFactors(tokens, grads, module.num_embeddings)
    if isinstance(module, nn.Conv2d):
        if x.dim() != 4:
            raise ValueError("Conv2d gradient clustering needs batched [B, C, H, W] inputs")
        patches = F.unfold(x.to(dtype), module.kernel_size, module.dilation, module.padding, module.stride)
        inputs = patches.transpose(1, 2)
        grads = grad.flatten(2).transpose(1, 2)
    else:
        if x.dim() < 2:
            raise ValueError("Linear gradient clustering needs batched [B, ..., in] inputs")
        if x.dtype != dtype:
            x = x.to(dtype)
        if x.dim() == 2:  # one position: the flat views are the captured tensors themselves
            return DenseFactors(x, grad, bias=has_bias(module))
        inputs = x.reshape(batch, -1, x.shape[-1])
        grads = grad.reshape(batch, inputs.shape[1], -1)
    return DenseFactors(inputs, grads, bias=has_bias(module))


def has_bias(module: nn.Module) -> bool:
    """Whether the layer has a trainable bias (the implicit ones column of its inputs)."""
    return module.bias is not None and module.bias.requires_grad


class LayerCapture:
    """Records each chosen layer's input (forward hook) and output gradient δ (tensor hook on its output).

    Forward inside :meth:`recording`; backward may run after it; then :meth:`factors` returns the batch's
    factors and clears. A layer that runs twice in one forward (weight sharing) is refused.
    """

    def __init__(self, layers: dict[str, nn.Module]) -> None:
        self.layers = layers
        self._inputs: dict[str, Tensor] = {}
        self._grads: dict[str, Tensor] = {}
        self._recording = False
        self._handles: list = []
        self._grad_hooks: dict[
            tuple[str, int], partial
        ] = {}  # the δ pre-hook per (layer, output_nr), made once
        self.all_flat = (
            False  # whether the last factors() were all Linear layers on [B, n] in their weights' dtype
        )
        # (weight dtype, bias) of the Linear layers: their [B, n] batches skip _factors' checks
        self._linear = {n: (m.weight.dtype, has_bias(m)) for n, m in layers.items() if type(m) is nn.Linear}

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Record the forwards run inside the ``with`` block. The layers' forward hooks are registered on the
        first recording (:meth:`attach`) and stay (a forward outside a recording pays one flag check per
        chosen layer) until :meth:`detach`."""
        self.attach()
        self._recording = True
        try:
            yield
        finally:
            self._recording = False

    def attach(self) -> None:
        """Register the layers' forward hooks (once)."""
        if not self._handles:
            self._handles = [
                m.register_forward_hook(partial(self._on_forward, n)) for n, m in self.layers.items()
            ]

    def detach(self) -> None:
        """Remove the forward hooks (the next :meth:`recording` registers them again)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _on_forward(self, name: str, module: nn.Module, args: tuple, output: Tensor) -> None:
        if not self._recording:
            return
        if name in self._inputs:
            raise RuntimeError(f"layer {name!r} ran twice in one capture (shared weights are not supported)")
        self._inputs[name] = args[0]  # not detached (an op per layer): read under no_grad only
        node = output.grad_fn
        if node is not None:  # δ = the gradient arriving at the node that made the output (its only output)
            key = (name, output.output_nr)
            hook = self._grad_hooks.get(key)
            if hook is None:
                hook = self._grad_hooks[key] = partial(self._on_grad, name, key[1])
            node.register_prehook(hook)

    def _on_grad(self, name: str, index: int, grads: tuple[Tensor | None, ...]) -> None:
        grad = grads[index]
        if grad is None:
            return
        if name in self._grads:
            raise RuntimeError(f"a second backward reached {name!r} in one capture")
        self._grads[name] = grad

    def factors(self, grad_scale: float = 1.0) -> dict[str, Factors]:
        """Factors of the recorded batch, δ divided by ``grad_scale`` (the backpropagated scalar was
        ``grad_scale · Σ_i ℓ_i``); clears the recording."""
        inputs, grads = self._inputs, self._grads
        self._inputs, self._grads = {}, {}
        detach = torch.is_grad_enabled()  # the tensors were kept as they came: detach unless under no_grad
        out = {}
        flat = 0
        for name, module in self.layers.items():
            if name not in inputs:
                raise RuntimeError(f"layer {name!r} did not run inside the capture")
            if name not in grads:
                raise RuntimeError(f"no output gradient reached {name!r}: run backward before after_backward")
            x, grad = (inputs[name].detach(), grads[name].detach()) if detach else (inputs[name], grads[name])
            if grad_scale != 1.0:
                grad = grad / grad_scale
            linear = self._linear.get(name)
            if linear is not None and x.dim() == 2 and x.dtype == grad.dtype == linear[0]:
                out[name] = DenseFactors(x, grad, bias=linear[1])  # what _factors makes of it, checks done
                flat += 1
            else:
                out[name] = _factors(module, x, grad)
        self.all_flat = flat == len(self.layers)
        return out
