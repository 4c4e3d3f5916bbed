"""raydist/models/image_encoders.py and cnn.py: the registry, the encoders' shapes, gradients and learning, backbone
weights from local files, and the optional torchvision/timm builders."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
from torch import nn

from raydist.models import image_encoders
from raydist.models.image_encoders import (
    Backbone,
    backbone_parameters,
    build_image_encoder,
    image_encoder_names,
    read_state_dict,
    register_image_encoder,
)
from raydist.models.vse import ImageEncoder


def test_names_and_unknown_names():
    assert image_encoder_names() == ["linear", "small-cnn", "timm:", "torchvision:"]
    for bad in ("resnet18", "torchvision:", "small-cnn:x"):
        with pytest.raises(ValueError, match="known: linear, small-cnn, timm:<model>, torchvision:<model>"):
            build_image_encoder(bad, 4)


def test_registering_a_name_twice_is_an_error(monkeypatch):
    monkeypatch.setattr(image_encoders._REGISTRY, "_entries", dict(image_encoders._REGISTRY._entries))

    @register_image_encoder("flat")
    def flat(*, in_dim, channels, image_size):
        return Backbone(nn.Flatten(), channels * image_size**2)

    assert "flat" in image_encoder_names()
    assert build_image_encoder("flat", 5, channels=2, image_size=3)(torch.ones(4, 2, 3, 3)).shape == (4, 5)
    for name in ("flat", "linear"):
        with pytest.raises(ValueError, match="already registered"):
            register_image_encoder(name)(flat)
    with pytest.raises(ValueError, match="family name ending in ':'"):
        register_image_encoder("a:b")(flat)


def test_linear_is_vsepps_image_projection():
    """Same seed, same weights as the VSE++ ImageEncoder (without its normalisation); gradients reach the head."""
    torch.manual_seed(0)
    enc = build_image_encoder("linear", 8, in_dim=16)
    torch.manual_seed(0)
    ref = ImageEncoder(16, 8, no_imgnorm=True)
    x = torch.randn(4, 16)
    out = enc(x)
    assert out.shape == (4, 8) and torch.equal(out, ref(x))
    out.square().sum().backward()
    assert enc.head.weight.grad is not None and enc.head.weight.grad.abs().sum() > 0
    assert backbone_parameters(enc) == []
    with pytest.raises(ValueError, match="needs in_dim"):
        build_image_encoder("linear", 8)


@pytest.mark.parametrize(("channels", "size"), [(1, 8), (3, 28), (3, 64)])
def test_small_cnn_shapes_and_gradients(channels, size):
    enc = build_image_encoder("small-cnn", 12, channels=channels, image_size=size, width=8, depth=4)
    out = enc(torch.randn(3, channels, size, size))
    assert out.shape == (3, 12)
    out.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in enc.parameters())
    assert enc.backbone.out_dim == 8 * 2**3 and enc.head.in_features == 64


def test_small_cnn_rows_do_not_depend_on_their_batch():
    """GroupNorm: in train mode a row's features are the same alone or among other rows (BatchNorm's are not)."""
    torch.manual_seed(0)
    enc = (
        build_image_encoder("small-cnn", 6, channels=3, width=8).train().double()
    )  # float64: no kernel noise
    x = torch.randn(5, 3, 16, 16, dtype=torch.float64)
    torch.testing.assert_close(enc(x[:2]), enc(x)[:2], rtol=0, atol=1e-12)


def _stripes(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """16×16 greyscale images of horizontal (label 0) or vertical (label 1) stripes of a random phase and period
    2–4, plus noise: both classes have the same mean and spread of intensity, only orientation tells them apart."""
    labels = torch.randint(0, 2, (n,), generator=generator)
    period = torch.randint(2, 5, (n, 1, 1), generator=generator).float()
    phase = torch.rand(n, 1, 1, generator=generator) * 6.3
    coord = torch.arange(16.0)
    rows = torch.sin(coord.view(1, 16, 1) * 6.2832 / period + phase).expand(n, 16, 16)
    cols = torch.sin(coord.view(1, 1, 16) * 6.2832 / period + phase).expand(n, 16, 16)
    images = torch.where(labels.view(n, 1, 1) == 0, rows, cols) + 0.3 * torch.randn(
        n, 16, 16, generator=generator
    )
    return images.unsqueeze(1), labels


@pytest.fixture
def one_thread():
    """Tiny convolutions run faster on one thread than on a shared machine's two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_small_cnn_learns_stripe_orientation(one_thread):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    enc = build_image_encoder("small-cnn", 2, channels=1, image_size=16, width=8, depth=2)
    opt = torch.optim.Adam(enc.parameters(), lr=1e-2)
    x_test, y_test = _stripes(256, gen)
    with torch.no_grad():
        before = nn.functional.cross_entropy(enc(x_test), y_test).item()
    for _ in range(80):
        x, y = _stripes(32, gen)
        loss = nn.functional.cross_entropy(enc(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        logits = enc(x_test)
    after = nn.functional.cross_entropy(logits, y_test).item()
    assert after < 0.3 * before, (before, after)
    assert (logits.argmax(1) == y_test).float().mean() > 0.9


def test_backbone_weights_round_trip(tmp_path):
    torch.manual_seed(0)
    trained = build_image_encoder("small-cnn", 4, channels=3, width=8)
    path = tmp_path / "backbone.pt"
    torch.save(trained.backbone.state_dict(), path)
    torch.manual_seed(1)
    fresh = build_image_encoder("small-cnn", 7, channels=3, width=8)
    torch.manual_seed(1)
    loaded = build_image_encoder("small-cnn", 7, channels=3, width=8, weights=path)
    x = torch.randn(2, 3, 20, 20)
    assert torch.equal(loaded.backbone(x), trained.backbone(x))
    assert not torch.equal(fresh.backbone(x), trained.backbone(x))
    assert torch.equal(loaded.head.weight, fresh.head.weight)  # the head is new, drawn as without weights
    ids = {id(p) for p in backbone_parameters(nn.Sequential(loaded))}
    assert ids == {id(p) for p in loaded.backbone.parameters()} and not ids & {
        id(p) for p in loaded.head.parameters()
    }


def test_weights_that_do_not_fit_are_refused_by_key(tmp_path):
    state = build_image_encoder("small-cnn", 4, channels=3, width=8).backbone.state_dict()
    cases = {
        "unexpected: features.99.weight": {**state, "features.99.weight": torch.zeros(1)},
        "missing: features.0.weight": {k: v for k, v in state.items() if k != "features.0.weight"},
        r"wrong shape: features.1.bias \(9,\) \(needs \(8,\)\)": {**state, "features.1.bias": torch.zeros(9)},
    }
    for i, (message, bad) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.pth"
        torch.save(bad, path)
        with pytest.raises(ValueError, match=message):
            build_image_encoder("small-cnn", 4, channels=3, width=8, weights=path)
    torch.save({"epoch": 3}, tmp_path / "not_weights.pt")
    with pytest.raises(ValueError, match="does not hold a state dict"):
        build_image_encoder("small-cnn", 4, weights=tmp_path / "not_weights.pt")


def test_safetensors_files(tmp_path, monkeypatch):
    state = {"w": torch.arange(6.0).view(2, 3)}
    try:
        from safetensors.torch import save_file
    except ImportError:
        pass
    else:
        save_file(state, str(tmp_path / "w.safetensors"))
        assert torch.equal(read_state_dict(tmp_path / "w.safetensors")["w"], state["w"])
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(ImportError, match="needs the safetensors package"):
        read_state_dict(tmp_path / "w.safetensors")


@pytest.mark.parametrize(
    ("name", "package"), [("torchvision:resnet18", "torchvision"), ("timm:resnet18", "timm")]
)
def test_a_missing_optional_package_is_a_clear_error(monkeypatch, name, package):
    for module in (package, f"{package}.models"):
        monkeypatch.setitem(sys.modules, module, None)  # `import` raises ImportError("import of … halted …")
    with pytest.raises(ImportError, match=rf"needs {package}.*halted.*pip install {package}"):
        build_image_encoder(name, 8)


def test_a_broken_install_is_a_clear_error_too(monkeypatch):
    """An installed torchvision built for other torch libraries fails with an OSError or RuntimeError."""

    def broken(module):
        raise OSError("libcudart.so.12: cannot open shared object file")

    monkeypatch.setattr(image_encoders.importlib, "import_module", broken)
    with pytest.raises(
        ImportError, match=r"needs torchvision.*OSError: libcudart.so.12.*pip install torchvision"
    ):
        build_image_encoder("torchvision:resnet18", 8)


class _TinyClassifier(nn.Module):
    """A stand-in for a torchvision/timm model: conv features, then ``fc`` (torchvision's resnet layout)."""

    def __init__(self, fc_out: int = 1000, image_size: int | None = None) -> None:
        super().__init__()
        self.image_size = image_size
        self.conv = nn.Conv2d(3, 6, 3)
        self.fc = nn.Linear(6, fc_out) if fc_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean(dim=(2, 3)))


def _fake_package(monkeypatch, name: str, attr: str, factory) -> None:
    package = types.ModuleType(name)
    models = types.ModuleType(f"{name}.models")
    setattr(models if name == "torchvision" else package, attr, factory)
    package.models = models
    monkeypatch.setitem(sys.modules, name, package)
    monkeypatch.setitem(sys.modules, f"{name}.models", models)


def test_torchvision_builder_replaces_the_classifier_and_loads_full_checkpoints(monkeypatch, tmp_path):
    calls = []

    def get_model(name, weights="default", **kwargs):
        calls.append((name, weights, kwargs))
        if name == "tiny_resnet":
            return _TinyClassifier(**kwargs)
        raise ValueError(name)

    _fake_package(monkeypatch, "torchvision", "get_model", get_model)
    reference = _TinyClassifier()
    torch.save(reference.state_dict(), tmp_path / "tiny.pth")  # a full checkpoint, classifier included
    enc = build_image_encoder("torchvision:tiny_resnet", 5, image_size=32, weights=tmp_path / "tiny.pth")
    assert calls[-1] == ("tiny_resnet", None, {"image_size": 32})  # weights=None: nothing is downloaded
    assert isinstance(enc.backbone.fc, nn.Identity) and enc.head.in_features == 6
    x = torch.randn(2, 3, 9, 9)
    assert enc(x).shape == (2, 5) and torch.equal(enc.backbone(x), reference.conv(x).mean(dim=(2, 3)))
    with pytest.raises(ValueError, match="takes RGB or greyscale images, not 4 channels"):
        build_image_encoder("torchvision:tiny_resnet", 5, channels=4)


def test_greyscale_reaches_an_rgb_model_as_if_decoded_as_rgb(monkeypatch, tmp_path):
    """A greyscale PNG, normalised as greyscale and given to a torchvision model, is what the same PNG decoded as
    RGB (PIL copies grey to R, G, B) and normalised with ImageNet's statistics gives it."""
    from PIL import Image

    from raydist.data.image_transforms import decode_image, default_mean_std, normalize

    _fake_package(
        monkeypatch, "torchvision", "get_model", lambda name, weights=None, **kw: _TinyClassifier(**kw)
    )
    reference = _TinyClassifier()
    torch.save(reference.state_dict(), tmp_path / "rgb.pth")  # RGB weights load for a greyscale dataset
    enc = build_image_encoder("torchvision:tiny_resnet", 5, channels=1, weights=tmp_path / "rgb.pth")
    assert list(enc.state_dict()) == [
        "backbone.conv.weight",
        "backbone.conv.bias",
        "head.weight",
        "head.bias",
    ]
    pixels = np.random.default_rng(0).integers(0, 256, (9, 11), dtype=np.uint8)
    Image.fromarray(pixels, mode="L").save(tmp_path / "g.png")
    png = (tmp_path / "g.png").read_bytes()
    grey = torch.as_tensor(normalize(decode_image(png, 1), *default_mean_std(1)))[None]
    rgb = torch.as_tensor(normalize(decode_image(png, 3), *default_mean_std(3)))[None]
    assert grey.shape == (1, 1, 9, 11) and rgb.shape == (1, 3, 9, 11)
    torch.testing.assert_close(enc.adapter(grey), rgb, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        enc.backbone(enc.adapter(grey)), reference.conv(rgb).mean(dim=(2, 3)), rtol=1e-5, atol=1e-6
    )


def test_image_size_goes_only_to_constructors_that_take_it(monkeypatch):
    seen = {}

    def get_model(name, weights=None, **kwargs):
        if name == "tiny_vit":
            net = _TinyClassifier(image_size=kwargs.pop("image_size", None), **kwargs)
            seen[name] = net.image_size
            return net
        net = nn.Sequential(nn.Flatten(), nn.Linear(12, 4), nn.ReLU(), nn.Linear(4, 1000))  # no image_size
        if kwargs:
            raise TypeError(
                f"Sequential.__init__() got an unexpected keyword argument {next(iter(kwargs))!r}"
            )
        return net

    _fake_package(monkeypatch, "torchvision", "get_model", get_model)
    build_image_encoder("torchvision:tiny_vit", 5, image_size=24)
    assert seen == {"tiny_vit": 24}
    enc = build_image_encoder("torchvision:mlp", 5, image_size=24)
    assert isinstance(enc.backbone[3], nn.Identity) and isinstance(enc.backbone[1], nn.Linear)
    assert enc(torch.randn(2, 3, 2, 2)).shape == (2, 5)


def test_timm_builder_asks_for_pooled_features_and_skips_the_classifier_keys(monkeypatch, tmp_path):
    calls = []

    def create_model(name, pretrained=True, num_classes=1000, in_chans=3, **kwargs):
        calls.append((name, pretrained, num_classes, in_chans, kwargs))
        net = _TinyClassifier(fc_out=num_classes)
        net.num_features, net.pretrained_cfg = 6, {"classifier": "fc"}
        return net

    _fake_package(monkeypatch, "timm", "create_model", create_model)
    torch.save(_TinyClassifier().state_dict(), tmp_path / "tiny.pth")
    enc = build_image_encoder("timm:tiny", 5, weights=tmp_path / "tiny.pth", drop_rate=0.1)
    assert calls == [("tiny", False, 0, 3, {"drop_rate": 0.1})]
    assert enc(torch.randn(2, 3, 8, 8)).shape == (2, 5)
    grey = build_image_encoder(
        "timm:tiny", 5, channels=1, weights=tmp_path / "tiny.pth"
    )  # RGB weights, grey data
    assert calls[-1][3] == 3 and isinstance(grey.adapter, image_encoders.GreyAsRGB)
    assert grey(torch.randn(2, 1, 8, 8)).shape == (2, 5)
