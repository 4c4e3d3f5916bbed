"""Image encoders chosen by name: ``linear`` (precomputed features), ``small-cnn``, ``torchvision:<model>`` and
``timm:<model>``; each is a backbone plus a new Linear head to ``out_dim``, the backbone's weights optionally
from a local file. torchvision and timm are optional: imported only when one of their models is built."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from raydist.config import ModelSection
from raydist.losses.similarity import l2_normalize
from raydist.models.cnn import SmallCNN
from raydist.registry import Registry


class Backbone(NamedTuple):
    """What a registered builder returns: the module mapping an input batch to [B, ``dim``] features, the
    state-dict key prefixes of the classifier it replaced (keys a pretrained file may hold and loading skips),
    and a parameter-free map applied to the input first (e.g. :class:`GreyAsRGB`), if any."""

    module: nn.Module
    dim: int
    head_keys: tuple[str, ...] = ()
    adapter: nn.Module | None = None


class GreyAsRGB(nn.Module):
    """Normalised greyscale images [B, 1, H, W] → the normalised RGB images a 3-channel model takes, exactly as if
    the image had been decoded as RGB (grey copied to R, G and B) and normalised with ImageNet's mean and std:
    pixel ``p = g·σ_grey + μ_grey``, channel ``c = (p − μ_c) / σ_c``. No parameters and no state-dict entries."""

    def __init__(self) -> None:
        super().__init__()
        from raydist.data.image_transforms import GREY_MEAN, GREY_STD, IMAGENET_MEAN, IMAGENET_STD

        mean, std = torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD)
        self.register_buffer("scale", (GREY_STD[0] / std).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("shift", ((GREY_MEAN[0] - mean) / std).view(1, 3, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != 1:
            raise ValueError(f"GreyAsRGB takes 1-channel images, got {x.shape[1]} channels")
        return x * self.scale.to(x.dtype) + self.shift.to(x.dtype)


class BackboneEncoder(nn.Module):
    """``head(backbone(adapter(x)))``: [B, …] inputs → [B, out_dim] features, unnormalised (the caller
    normalises). The head is a new Linear, initialised as VSE++'s image projection (Xavier uniform, zero bias);
    the adapter (identity unless the builder gives one) holds no state."""

    def __init__(self, backbone: nn.Module, dim: int, out_dim: int, adapter: nn.Module | None = None) -> None:
        super().__init__()
        self.adapter = adapter if adapter is not None else nn.Identity()
        self.backbone = backbone
        self.head = nn.Linear(dim, out_dim)
        bound = math.sqrt(6.0) / math.sqrt(dim + out_dim)
        nn.init.uniform_(self.head.weight, -bound, bound)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(self.adapter(x)))


Builder = Callable[..., Backbone]
_REGISTRY: Registry[Builder] = Registry("image encoder", families=True)


def register_image_encoder(name: str) -> Callable[[Builder], Builder]:
    """Register ``builder(*, in_dim, channels, image_size, **options) -> Backbone`` under ``name`` (a decorator).
    A name ending in ``:`` is a family: ``"fam:"`` builds every ``"fam:<model>"``, its builder taking ``model``
    as its first argument. A name registered twice is an error."""
    return _REGISTRY.register(name)


def image_encoder_names() -> list[str]:
    """The registered names, sorted; a name ending in ``:`` takes a model name after it."""
    return _REGISTRY.names()


def build_image_encoder(
    name: str,
    out_dim: int,
    *,
    in_dim: int | None = None,
    channels: int = 3,
    image_size: int | None = None,
    weights: str | Path | None = None,
    **options: Any,
) -> BackboneEncoder:
    """The encoder ``name`` ending in a new Linear to ``out_dim``. ``in_dim``: the feature dim (``linear``);
    ``channels``/``image_size``: the images' (an architecture that fixes its input size gets ``image_size``,
    others ignore it); ``weights``: a local state dict of the backbone (:func:`load_backbone_weights`), loaded
    before the head is added; ``options``: the builder's own (``small-cnn``: width, depth; torchvision/timm:
    keyword arguments of the model's constructor)."""
    builder, args = _REGISTRY.resolve(name)
    backbone = builder(*args, in_dim=in_dim, channels=channels, image_size=image_size, **options)
    if weights is not None:
        load_backbone_weights(backbone.module, weights, backbone.head_keys)
    return BackboneEncoder(backbone.module, backbone.dim, out_dim, backbone.adapter)


@functools.lru_cache(maxsize=32)
def image_encoder_problem(
    name: str, weights: str | None, *, channels: int, image_size: int | None
) -> str | None:
    """Why the encoder ``name`` (with the backbone weights file ``weights``) cannot be built for images of
    ``channels`` × ``image_size``², or None. The backbone is built on the meta device (no memory, no
    initialisation) and the file's tensor names and shapes are compared with it without loading them: what
    a training worker would otherwise find only after Ray started (a missing package, an unknown model, a
    file of another architecture). Cached per arguments, so a sweep's trials cost one check."""
    try:
        builder, args = _REGISTRY.resolve(name)
        with torch.device("meta"):
            backbone = builder(*args, in_dim=None, channels=channels, image_size=image_size)
    except (ImportError, ValueError, TypeError, KeyError) as err:
        return f"model.image_encoder={name}: {err}"
    except Exception:  # noqa: BLE001 -- e.g. an init op the meta device lacks: no verdict, the workers build it
        return None
    if weights is None:
        return None
    try:
        found = fit_problems(backbone.module.state_dict(), read_state_dict(weights), backbone.head_keys)
    except (OSError, ValueError, RuntimeError, ImportError) as err:
        return f"model.image_weights={weights}: {err}"
    return f"model.image_weights={weights} does not fit {name} ({found})" if found else None


class UnitImageEncoder(nn.Module):
    """``normalize(encoder(x))`` (``normalize=False``: the raw output, VSE0's ``no_imgnorm``): an image encoder's
    embeddings on the unit sphere, as the feature encoders give them."""

    def __init__(self, encoder: BackboneEncoder, normalize: bool = True) -> None:
        super().__init__()
        self.encoder, self.normalize = encoder, normalize

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        out = self.encoder(images)
        return l2_normalize(out) if self.normalize else out


def encoder_options(model: ModelSection) -> dict[str, Any]:
    """The builder options the config gives ``model.image_encoder``: ``small-cnn`` takes ``model.cnn_width``,
    ``model.cnn_depth`` and ``model.cnn_grid``; other encoders take none from the config."""
    if model.image_encoder != "small-cnn":
        return {}
    return {"width": model.cnn_width, "depth": model.cnn_depth, "grid": model.cnn_grid}


def image_encoder_from_config(
    model: ModelSection, *, channels: int, image_size: int, normalize: bool = True
) -> UnitImageEncoder:
    """``model.image_encoder`` for images of ``channels`` × ``image_size``², ending in a Linear to
    ``model.embed_dim``, its backbone loaded from ``model.image_weights`` when set."""
    encoder = build_image_encoder(
        model.image_encoder,
        model.embed_dim,
        channels=channels,
        image_size=image_size,
        weights=model.image_weights or None,
        **encoder_options(model),
    )
    return UnitImageEncoder(encoder, normalize)


def backbone_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The backbone parameters of every :class:`BackboneEncoder` inside ``model`` (DDP-wrapped or not): the
    group a learning-rate multiplier applies to; the new heads and the rest of ``model`` are not in it."""
    return [p for m in model.modules() if isinstance(m, BackboneEncoder) for p in m.backbone.parameters()]


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict from a local file: ``.safetensors`` (needs the ``safetensors`` package), else ``torch.load``
    with ``weights_only=True`` (``.pt``, ``.pth``, ``.bin``)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError as err:
            raise ImportError(
                f"reading {path} needs the safetensors package (pip install safetensors): {err}"
            ) from err
        state = load_file(str(path))
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} does not hold a state dict (parameter names → tensors)")
    return dict(state)


def load_backbone_weights(module: nn.Module, path: str | Path, head_keys: tuple[str, ...] = ()) -> None:
    """Load the state dict in ``path`` into ``module``: every key must match by name and shape, except keys
    under ``head_keys`` (the replaced classifier's), which are skipped; anything else is a ValueError naming
    the missing, unexpected and mis-shaped keys."""
    state = read_state_dict(path)
    own = module.state_dict()
    found = fit_problems(own, state, head_keys)
    if found:
        raise ValueError(f"{path} does not fit the backbone ({found})")
    module.load_state_dict({k: state[k] for k in own})


def fit_problems(
    own: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor], head_keys: tuple[str, ...] = ()
) -> str:
    """How the state dict ``state`` fails to fit a module whose state dict is ``own`` (names and shapes; keys
    under ``head_keys`` may be extra): the missing, unexpected and mis-shaped keys, or "" when it fits."""

    def is_head(key: str) -> bool:
        return any(key == h or key.startswith(h + ".") for h in head_keys)

    problems = {
        "missing": sorted(k for k in own if k not in state),
        "unexpected": sorted(k for k in state if k not in own and not is_head(k)),
        "wrong shape": sorted(
            f"{k} {tuple(state[k].shape)} (needs {tuple(own[k].shape)})"
            for k in own
            if k in state and state[k].shape != own[k].shape
        ),
    }
    return "; ".join(
        f"{what}: {', '.join(keys[:10])}{' …' if len(keys) > 10 else ''}"
        for what, keys in problems.items()
        if keys
    )


def import_problem(module: str) -> str | None:
    """None when ``module`` imports here; else why not: ``"not installed"``, or the exception a broken install
    raises (a torchvision wheel built for other torch libraries fails with OSError or RuntimeError)."""
    if importlib.util.find_spec(module.partition(".")[0]) is None:
        return "not installed"
    try:
        importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 -- a broken install raises more than ImportError; the reason is returned
        return f"{type(err).__name__}: {err}"
    return None


def _import_optional(module: str, package: str, encoder: str) -> Any:
    """``module``, or an ImportError naming ``package`` and why it failed. Any exception counts: a broken
    install (say a wheel built for other torch libraries) fails with more than ImportError."""
    try:
        return importlib.import_module(module)
    except Exception as err:
        raise ImportError(
            f"image encoder {encoder!r} needs {package}, which cannot be imported here "
            f"({type(err).__name__}: {err}); install one built for torch {torch.__version__}: pip install {package}"
        ) from err


def _construct(
    factory: Callable[..., nn.Module], model: str, size_key: str, image_size: int | None, **kwargs: Any
) -> nn.Module:
    """``factory(model, **kwargs)``, given ``size_key=image_size`` when the architecture takes it (a ViT's fixed
    input size): a TypeError naming ``size_key`` means it does not, and the model is built without it."""
    if image_size is None:
        return factory(model, **kwargs)
    try:
        return factory(model, **{size_key: image_size}, **kwargs)
    except TypeError as err:
        if size_key not in str(err):
            raise
        return factory(model, **kwargs)


@register_image_encoder("linear")
def _linear(*, in_dim: int | None, channels: int, image_size: int | None) -> Backbone:
    """Precomputed features [B, in_dim]: no backbone, the head alone (VSE++'s image projection)."""
    if in_dim is None:
        raise ValueError("image encoder 'linear' needs in_dim, the feature dim")
    return Backbone(nn.Identity(), in_dim)


@register_image_encoder("small-cnn")
def _small_cnn(
    *,
    in_dim: int | None,
    channels: int,
    image_size: int | None,
    width: int = 32,
    depth: int = 3,
    grid: int = 1,
) -> Backbone:
    """:class:`SmallCNN` over [B, channels, H, W] images of any size."""
    cnn = SmallCNN(channels, width=width, depth=depth, grid=grid)
    return Backbone(cnn, cnn.out_dim)


# the auxiliary classifiers of torchvision's GoogLeNet (aux1, aux2) and Inception v3 (AuxLogits): built without
# them, a model's weights file that holds them still loads
TORCHVISION_AUX_HEADS = ("aux1", "aux2", "AuxLogits")


@register_image_encoder("torchvision:")
def _torchvision(
    model: str, *, in_dim: int | None, channels: int, image_size: int | None, **options: Any
) -> Backbone:
    """``torchvision.models.get_model(model, weights=None, **options)`` (``aux_logits=False`` where the model takes
    it) with its classifier -- the last Linear it registers (``fc``, ``heads.head``, ``classifier.N``) -- replaced
    by Identity. The models take RGB; greyscale images reach them through :class:`GreyAsRGB` (as if decoded as
    RGB), so RGB weights fit."""
    models = _import_optional("torchvision.models", "torchvision", f"torchvision:{model}")
    if channels not in (1, 3):
        raise ValueError(f"torchvision:{model} takes RGB or greyscale images, not {channels} channels")
    try:  # GoogLeNet and Inception v3 return their auxiliary classifiers' logits too in training mode: none
        net = _construct(
            models.get_model,
            model,
            "image_size",
            image_size,
            weights=None,
            **{"aux_logits": False, **options},
        )
    except TypeError as err:
        if "aux_logits" not in str(err):
            raise
        net = _construct(models.get_model, model, "image_size", image_size, weights=None, **options)
    linears = [(name, m) for name, m in net.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(f"torchvision:{model} has no Linear classifier to replace")
    name, classifier = linears[-1]
    parent, _, attr = name.rpartition(".")
    setattr(net.get_submodule(parent), attr, nn.Identity())
    aux = tuple(a for a in TORCHVISION_AUX_HEADS if getattr(net, a, None) is None)  # a full file's: skipped
    return Backbone(net, classifier.in_features, (name, *aux), GreyAsRGB() if channels == 1 else None)


@register_image_encoder("timm:")
def _timm(
    model: str, *, in_dim: int | None, channels: int, image_size: int | None, **options: Any
) -> Backbone:
    """``timm.create_model(model, pretrained=False, num_classes=0, in_chans=3, **options)``: pooled features, its
    classifier (``pretrained_cfg["classifier"]``) already removed. Greyscale images reach its RGB input through
    :class:`GreyAsRGB` (as for torchvision), so an RGB weights file fits them too."""
    timm = _import_optional("timm", "timm", f"timm:{model}")
    if channels not in (1, 3):
        raise ValueError(f"timm:{model} takes RGB or greyscale images here, not {channels} channels")
    net = _construct(
        timm.create_model,
        model,
        "img_size",
        image_size,
        pretrained=False,
        num_classes=0,
        in_chans=3,
        **options,
    )
    classifier = (getattr(net, "pretrained_cfg", None) or {}).get("classifier") or ()
    head_keys = (classifier,) if isinstance(classifier, str) else tuple(classifier)
    return Backbone(
        net,
        getattr(net, "head_hidden_size", None) or net.num_features,
        head_keys,
        GreyAsRGB() if channels == 1 else None,
    )
