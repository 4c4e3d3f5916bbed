"""Gradient caching (GradCache, Gao et al. 2021) for ``train.grad_cache_chunk=N``: a step whose batch exceeds the
encoders' activation memory, with exact gradients and cross-worker negatives.

1. The encoders run over this worker's batch N rows at a time without a graph (``torch.no_grad``); the outputs
   are concatenated into leaf tensors.
2. The task's loss runs on those leaves as it runs on the embeddings of an uncached step (gather across workers,
   negative-set draw, miners, Matryoshka nesting) and is back-propagated to them: the gradient of the loss with
   respect to every output row (the gather's backward brings the other workers' share home).
3. The encoders re-run N rows at a time with a graph, and each chunk's outputs back-propagate their cached
   gradients: by the chain rule through the outputs the parameters receive the gradient of one backward
   through the whole batch's graph, while only one chunk's activations are held at a time.

Exactness needs each chunk's second forward to compute what its first did. The torch RNG (CPU, and the CUDA
device's) is saved before each chunk's first forward and restored before its re-run, so dropout, stochastic
depth and in-model augmentation draw the same numbers in both passes; the RNG is left as the first pass and
the loss left it. Augmentation in the data pipeline (crops, flips, the caption of the epoch) happens before the
step: both passes read the same tensors. A row's outputs must not depend on the other rows of its chunk, and
the forward must not change state: BatchNorm in training mode (batch statistics, running statistics updated
in both passes) is refused (:func:`stateful_modules`), and so are hooks with a forward context (gradient
clustering, refused in :func:`raydist.config.validate`). Under DDP the gradients are reduced once: every chunk
but the last re-runs inside ``no_sync`` and the last chunk's backward reduces the accumulated gradients. Mixed
precision: both passes run under the same autocast; the loss's backward is scaled (fp16), so the cached
gradients and hence the parameter gradients carry the scale that the GradScaler then removes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm, _NormBase

from raydist.config import Config, ConfigError
from raydist.models.image_encoders import image_encoder_from_config
from raydist.tasks import DataInfo, Encoded, Task
from raydist.tasks.images import crop_size
from raydist.train.hooks import Hook

# Encoded.extras entries that hold one row per batch row (as Encoded.weighted treats them): a tensor or one per
# nested dim. Other tensor extras (the margin loss's β) do not depend on the rows: their gradient is added once.
ROW_EXTRAS = ("logits",)


@dataclass(frozen=True)
class RngState:
    """The torch RNG state of the CPU and, on a CUDA device, of that device."""

    cpu: Tensor
    device: torch.device
    cuda: Tensor | None

    @classmethod
    def capture(cls, device: torch.device) -> RngState:
        """The state now."""
        cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        return cls(torch.get_rng_state(), device, cuda)

    def restore(self) -> None:
        """Set the RNG back to this state."""
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


def stateful_modules(model: nn.Module) -> list[str]:
    """The modules of ``model`` that break gradient caching, one line each: BatchNorm (any ``_BatchNorm``,
    SyncBatchNorm included) normalises a row by statistics of its chunk rather than of the batch in training
    mode, and a norm layer that tracks running statistics updates them in both passes."""
    lines = []
    for name, module in model.named_modules():
        if isinstance(module, _BatchNorm) or (isinstance(module, _NormBase) and module.track_running_stats):
            lines.append(
                f"{name or 'the model'} ({type(module).__name__}): batch statistics per chunk, running "
                "statistics updated in both passes"
            )
    return lines


def grad_cache_problems(cfg: Config, info: DataInfo) -> list[str]:
    """Why ``train.grad_cache_chunk`` cannot run with this config and data, before Ray starts: an image encoder
    with BatchNorm (built on the meta device, without its weights file). Anything the meta build cannot tell
    (it fails, or a pretrained text model) is checked by the workers at the first step (:func:`check_model`)."""
    chunk = cfg.train.grad_cache_chunk
    if not chunk or not info.encoded:  # feature vectors: the linear / MLP encoders have no norm layers
        return []
    model = cfg.model.model_copy(update={"image_weights": ""})
    try:
        with torch.device("meta"):
            encoder = image_encoder_from_config(
                model, channels=info.image_channels or 3, image_size=crop_size(cfg, info)
            )
    except Exception:  # noqa: BLE001 -- no verdict here; the image checks and the workers report it
        return []
    return [
        f"train.grad_cache_chunk={chunk} with model.image_encoder={cfg.model.image_encoder}: {line}; use an "
        "encoder without BatchNorm (small-cnn uses GroupNorm) or train.grad_cache_chunk=0"
        for line in stateful_modules(encoder)
    ]


def check_grad_cache(cfg: Config, info: DataInfo) -> None:
    """Raise a ConfigError listing :func:`grad_cache_problems`, or return."""
    problems = grad_cache_problems(cfg, info)
    if problems:
        raise ConfigError("gradient caching is refused:\n  " + "\n  ".join(problems))


def check_model(model: nn.Module, hooks: Sequence[Hook], chunk: int) -> None:
    """Refuse (ConfigError) a model with :func:`stateful_modules` in training mode, and hooks that wrap the
    forward pass (they would see the chunks, not the batch)."""
    lines = [line for line in stateful_modules(model) if model.training]
    wrapping = [type(h).__name__ for h in hooks if type(h).forward_context is not Hook.forward_context]
    lines += [f"hook {name} wraps the forward pass" for name in wrapping]
    if lines:
        raise ConfigError(f"train.grad_cache_chunk={chunk} is refused: " + "; ".join(lines))


def _row_outputs(encoded: Encoded) -> dict[str, Tensor]:
    """The per-row tensors of ``encoded`` by a flat name: its embeddings and the :data:`ROW_EXTRAS`."""
    out = {f"embeddings/{k}": v for k, v in encoded.embeddings.items()}
    for key in ROW_EXTRAS:
        value = encoded.extras.get(key)
        if isinstance(value, list):
            out.update({f"extras/{key}/{i}": v for i, v in enumerate(value)})
        elif isinstance(value, Tensor):
            out[f"extras/{key}"] = value
    return out


def _shared_outputs(encoded: Encoded) -> dict[str, Tensor]:
    """The floating tensor extras that are not per row (e.g. the margin loss's β), by a flat name."""
    return {
        f"extras/{k}": v
        for k, v in encoded.extras.items()
        if k not in ROW_EXTRAS and isinstance(v, Tensor) and v.is_floating_point()
    }


def _rebuild(template: Encoded, tensors: dict[str, Tensor], ids: dict[str, Tensor]) -> Encoded:
    """``template`` with its tensors replaced by ``tensors`` (flat names of :func:`_row_outputs` and
    :func:`_shared_outputs`) and its ids by ``ids``."""
    extras: dict[str, Any] = {}
    for key, value in template.extras.items():
        if isinstance(value, list) and key in ROW_EXTRAS:
            extras[key] = [tensors[f"extras/{key}/{i}"] for i in range(len(value))]
        else:
            extras[key] = tensors.get(f"extras/{key}", value)
    return Encoded({k: tensors[f"embeddings/{k}"] for k in template.embeddings}, ids, extras)


def _rows(grad: Tensor | None, start: int, stop: int) -> Tensor | None:
    """Rows ``start:stop`` of a cached gradient (None: the loss did not depend on that output)."""
    return None if grad is None else grad[start:stop]


def _sync_context(model: nn.Module, sync: bool) -> AbstractContextManager[Any]:
    """DDP's ``no_sync`` unless ``sync`` (or the model is not DDP-wrapped)."""
    return nullcontext() if sync or not hasattr(model, "no_sync") else model.no_sync()


def cached_step_backward(
    model: nn.Module,
    task: Task,
    batch: dict[str, Tensor],
    loss_of: Callable[[Encoded], Tensor],
    *,
    chunk: int,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager[Any]],
    backward: Callable[[Tensor], None],
) -> Tensor:
    """The three passes of the module docstring on this worker's ``batch`` (tensors of one row per batch row),
    leaving the parameter gradients of ``loss_of(task.encode(model, batch))`` accumulated in ``.grad``; returns
    that loss (detached). ``autocast()``: the context of every forward (mixed precision); ``backward(loss)``:
    back-propagates the loss (``scaler.scale(loss).backward()``). Every rank must call it with the same rows
    and ``chunk``: the chunk count, and so the collectives of a DDP forward, match across ranks."""
    rows = next(iter(batch.values())).shape[0]
    spans = [(s, min(s + chunk, rows)) for s in range(0, rows, chunk)]
    states, parts = [], []
    with torch.no_grad():
        for start, stop in spans:
            states.append(RngState.capture(device))
            with autocast():
                parts.append(task.encode(model, {k: v[start:stop] for k, v in batch.items()}))
    template, shared = parts[0], _shared_outputs(parts[0])
    leaves = {
        name: torch.cat([_row_outputs(p)[name] for p in parts]).requires_grad_()
        for name in _row_outputs(template)
    }
    leaves.update({name: t.detach().requires_grad_() for name, t in shared.items()})
    ids = {k: torch.cat([p.ids[k] for p in parts]) for k in template.ids}
    del parts  # the chunks' outputs live on in the leaves only
    loss = loss_of(_rebuild(template, leaves, ids))
    backward(loss)
    after = RngState.capture(device)
    for i, ((start, stop), state) in enumerate(zip(spans, states, strict=False)):
        last = i == len(spans) - 1
        state.restore()
        with _sync_context(model, last):
            with autocast():
                encoded = task.encode(model, {k: v[start:stop] for k, v in batch.items()})
            outputs = {n: (t, _rows(leaves[n].grad, start, stop)) for n, t in _row_outputs(encoded).items()}
            if last:  # the row-independent outputs' gradient, once
                outputs.update({n: (t, leaves[n].grad) for n, t in _shared_outputs(encoded).items()})
            pairs = [(t, g) for t, g in outputs.values() if g is not None and t.requires_grad]
            if pairs:
                torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
    after.restore()
    return loss.detach()
