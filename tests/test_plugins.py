"""Plugins (raydist.plugins) and the registry (raydist.registry): a file that no import path reaches registers
components once per process, under its own module name; a plugin that is missing, broken or named like another
module is refused naming it; a config names its plugins and imports them before it is validated; what a job
ships to Ray's other processes (runtime_env py_modules); registered hooks join a run in their order."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from raydist import plugins
from raydist.config import Config, apply_overrides, from_dict
from raydist.models.image_encoders import build_image_encoder, image_encoder_names
from raydist.plugins import PluginError, load_plugins, plugin_runtime_env, resolve_spec
from raydist.registry import Registry, RegistryError, registries, registry
from raydist.runtime import JOB_CONFIG_ENV, job_runtime_env
from raydist.train.hooks import HOOKS, Hook, HookSite, register_hook, registered_hooks

ENCODER_PLUGIN = """
import torch
from torch import nn
from raydist.models.image_encoders import Backbone, register_image_encoder

LOADS = []
LOADS.append(1)  # how many times this module ran


@register_image_encoder("{name}")
def build(*, in_dim, channels, image_size):
    return Backbone(nn.Sequential(nn.Flatten(), nn.LazyLinear(7)), 7)
"""


@pytest.fixture
def fresh(monkeypatch):
    """Plugins loaded by a test are forgotten after it: their modules, the loaded list, and their registrations
    (unregistered, so a loss kind's options leave the config too)."""
    monkeypatch.setattr(plugins, "_loaded", {})
    monkeypatch.setattr(plugins, "_entry_points_loaded", False)
    names = {kind: set(reg.names()) for kind, reg in registries().items()}
    before = set(sys.modules)
    yield
    for kind, reg in registries().items():
        for name in set(reg.names()) - names.get(kind, set()):
            reg.unregister(name)
    for name in set(sys.modules) - before:
        del sys.modules[name]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_a_plugin_file_registers_once_under_its_own_module_name(tmp_path, fresh):
    file = write(tmp_path / "elsewhere" / "myenc_plugin.py", ENCODER_PLUGIN.format(name="plugin-flat"))
    with pytest.raises(ModuleNotFoundError):
        __import__("myenc_plugin")  # not importable: only the plugin loader finds it
    (module,) = load_plugins([str(file)])
    assert module.__name__ == "myenc_plugin" and sys.modules["myenc_plugin"] is module
    assert "plugin-flat" in image_encoder_names()
    assert registry("image encoder").module_of("plugin-flat") == "myenc_plugin"
    load_plugins([str(file)])  # again (a second config naming it): not run twice
    assert module.LOADS == [1]
    encoder = build_image_encoder("plugin-flat", 5, channels=1, image_size=3)
    import torch

    assert encoder(torch.ones(2, 1, 3, 3)).shape == (2, 5)


def test_a_package_folder_is_a_plugin(tmp_path, fresh):
    pkg = tmp_path / "mypkg_plugin"
    write(pkg / "__init__.py", "from mypkg_plugin.parts import NAME\n")
    write(pkg / "parts.py", ENCODER_PLUGIN.format(name="pkg-flat") + "\nNAME = 'x'\n")
    (module,) = load_plugins([str(pkg)])
    assert module.NAME == "x" and "pkg-flat" in image_encoder_names()
    assert registry("image encoder").module_of("pkg-flat") == "mypkg_plugin.parts"


def test_bad_plugins_are_refused_naming_them(tmp_path, fresh):
    with pytest.raises(PluginError, match=r"plugin .*missing\.py: no such file"):
        load_plugins([str(tmp_path / "missing.py")])
    broken = write(tmp_path / "broken_plugin.py", "x = 1\nraise RuntimeError('no GPU here')\n")
    with pytest.raises(PluginError) as e:
        load_plugins([str(broken)])
    assert str(broken) in str(e.value) and "RuntimeError: no GPU here" in str(e.value)
    assert f"{broken}:2" in str(e.value)  # the line in the plugin
    assert "broken_plugin" not in sys.modules  # a failed import leaves nothing half-registered behind
    taken = write(tmp_path / "json.py", "X = 1\n")  # would shadow the standard library's json
    with pytest.raises(PluginError, match="module name 'json' is taken"):
        load_plugins([str(taken)])
    with pytest.raises(PluginError, match="no module named 'no_such_module_xyz'"):
        load_plugins(["no_such_module_xyz"])
    write(tmp_path / "notpkg" / "a.py", "")
    with pytest.raises(PluginError, match="no __init__.py"):
        load_plugins([str(tmp_path / "notpkg")])
    twice = write(tmp_path / "twice_plugin.py", ENCODER_PLUGIN.format(name="linear"))
    with pytest.raises(PluginError, match="image encoder 'linear' is already registered by raydist"):
        load_plugins([str(twice)])


def test_a_config_imports_its_plugins_before_it_is_validated(tmp_path, fresh, monkeypatch):
    write(tmp_path / "cfg_plugin.py", ENCODER_PLUGIN.format(name="cfg-flat"))
    monkeypatch.chdir(tmp_path)
    cfg = apply_overrides(Config(), {"plugins": "cfg_plugin.py", "model.image_encoder": "cfg-flat"})
    assert cfg.plugins == [str(tmp_path / "cfg_plugin.py")]  # stored absolute: the saved config finds it
    assert "cfg-flat" in image_encoder_names()
    assert from_dict(cfg.to_dict()).plugins == cfg.plugins  # what a worker or a checkpoint reads back
    assert resolve_spec("some.module") == "some.module"


def test_the_job_ships_path_plugins_and_modules_outside_site_packages(tmp_path, fresh, monkeypatch):
    file = write(tmp_path / "ship_plugin.py", "")
    pkg = write(tmp_path / "shipped_pkg" / "__init__.py", "").parent
    monkeypatch.syspath_prepend(str(tmp_path))  # shipped_pkg importable here only (like the cwd)
    env = plugin_runtime_env([str(file), "shipped_pkg", "yaml", "json"])
    assert env == {"py_modules": [str(file), str(pkg)]}  # yaml: site-packages; json: the standard library
    assert plugin_runtime_env([]) == {}
    monkeypatch.delenv("RAY_OVERRIDE_JOB_RUNTIME_ENV", raising=False)
    monkeypatch.setenv(
        JOB_CONFIG_ENV, json.dumps({"runtime_env": {"py_modules": ["gcs://_ray_pkg_abc.zip"]}})
    )
    assert job_runtime_env([str(file)]) == {"py_modules": ["gcs://_ray_pkg_abc.zip", str(file)]}


def test_entry_points_are_plugins(tmp_path, fresh, monkeypatch):
    site = tmp_path / "site"
    write(site / "ep_plugin_mod.py", ENCODER_PLUGIN.format(name="ep-flat"))
    dist = site / "ep_plugin-1.0.dist-info"
    write(dist / "METADATA", "Metadata-Version: 2.1\nName: ep-plugin\nVersion: 1.0\n")
    write(dist / "entry_points.txt", "[raydist.plugins]\nflat = ep_plugin_mod\n")
    monkeypatch.syspath_prepend(str(site))
    load_plugins([])
    assert "ep-flat" in image_encoder_names()
    assert registry("image encoder").module_of("ep-flat") == "ep_plugin_mod"


def test_registry_names_and_errors():
    reg: Registry[int] = Registry("test thing", families=True)
    try:
        reg.register("alpha", 1)
        reg.register("fam:", 2)
        assert reg.resolve("fam:x") == (2, ("x",)) and reg.get("alpha") == 1
        assert "fam:y" in reg and "fam:" not in reg and "beta" not in reg
        with pytest.raises(RegistryError, match="did you mean alpha"):
            reg.get("alpah")
        with pytest.raises(RegistryError, match="already registered"):
            reg.register("alpha", 3)
        with pytest.raises(RegistryError, match="a plain name, or a family"):
            reg.register("a:b", 3)
        with pytest.raises(RegistryError, match="exists already"):
            Registry("test thing")
        assert registries()["test thing"] is reg
    finally:
        from raydist import registry as module

        module._REGISTRIES.pop("test thing")


class _Marker(Hook):
    def __init__(self, label: str) -> None:
        self.label = label


def test_registered_hooks_join_every_run_in_their_order(monkeypatch):
    import raydist.train.wiring  # noqa: F401 -- the shipped hooks register

    monkeypatch.setattr(HOOKS, "_entries", {})
    register_hook("late", order=95)(lambda site: _Marker("late"))
    register_hook("off")(lambda site: None)  # stays out of the run
    register_hook("b-mid")(lambda site: _Marker("b"))
    register_hook("a-mid")(lambda site: _Marker(f"a:{site.cfg.train.seed}"))
    register_hook("early", order=1)(lambda site: _Marker("early"))
    site = HookSite(from_dict({"train.seed": 7}), task=None, runtime=None, run_dir=None)
    assert [h.label for h in registered_hooks(site)] == ["early", "a:7", "b", "late"]


def test_the_shipped_hooks_are_registered_in_the_loop_order():
    import raydist.train.wiring  # noqa: F401

    shipped = [
        "slow-steps",
        "fail-at-step",
        "gradient-clustering",
        "corpus-negatives",
        "validation",
        "tracking",
        "stop-file",
    ]
    assert [
        n for n in sorted(HOOKS.names(), key=lambda n: HOOKS.get(n).hook_order) if n in shipped
    ] == shipped


EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "contrastive_plugin.py"


def test_the_documented_example_loss_is_the_contrastive_loss(tmp_path, fresh):
    """docs/examples/contrastive_plugin.py (trained end to end in tests/test_plugins_e2e.py): its loss and
    gradient on one worker's batch equal a float64 double loop over the pairs; its encoder builds."""
    import torch

    from raydist.distributed import GatheredBatch, NegativeSet
    from raydist.losses import LossInputs, get_loss

    plugin = tmp_path / EXAMPLE.name
    plugin.write_text(EXAMPLE.read_text())
    cfg = apply_overrides(
        Config(),
        {
            "plugins": str(plugin),
            "loss.kind": "contrastive",
            "loss.neg_margin": "0.7",
            "loss.pos_margin": "0.1",
        },
    )
    kind = get_loss("contrastive")(cfg)
    g = torch.Generator().manual_seed(0)
    raw = torch.randn(12, 5, generator=g, dtype=torch.float64)  # the encoder's rows before its L2 norm
    labels = torch.randint(0, 3, (12,), generator=g)
    x = raw.clone().requires_grad_(True)
    rows = torch.arange(12)
    local = {"emb": torch.nn.functional.normalize(x, dim=1), "label": labels}
    batch = GatheredBatch(local, dict(local), rows, rows, 0, 1)
    stats: dict[str, float] = {}
    value = kind.loss(LossInputs(batch, NegativeSet(query_rows=rows, key_rows=None), {}, 0, 0, stats))
    value.backward()

    y = raw.clone().requires_grad_(True)
    total, count = 0.0, 0
    for i in range(12):
        for j in range(12):
            if i == j:
                continue
            d = (y[i] / y[i].norm() - y[j] / y[j].norm()).norm()
            total = total + (
                torch.clamp(d - 0.1, min=0) ** 2
                if labels[i] == labels[j]
                else torch.clamp(0.7 - d, min=0) ** 2
            )
            count += 1
    reference = total / count
    reference.backward()
    assert abs(value.item() - reference.item()) < 1e-9
    assert torch.allclose(x.grad, y.grad, atol=1e-9)
    assert stats == {"contrastive/workers": 1.0}
    from raydist.models.image_encoders import build_image_encoder

    assert build_image_encoder("tiny-conv", 8, channels=3, image_size=16)(torch.ones(2, 3, 16, 16)).shape == (
        2,
        8,
    )


def test_a_preset_file_names_plugins_relative_to_itself(tmp_path, fresh, monkeypatch):
    from raydist.config import load_config

    write(tmp_path / "presets" / "plug" / "preset_plugin.py", ENCODER_PLUGIN.format(name="preset-flat"))
    preset = write(
        tmp_path / "presets" / "mine.yaml",
        "plugins: [plug/preset_plugin.py]\nmodel:\n  image_encoder: preset-flat\n",
    )
    monkeypatch.chdir(tmp_path)  # not the preset's folder
    cfg = load_config(preset_file=preset)
    assert cfg.plugins == [str(tmp_path / "presets" / "plug" / "preset_plugin.py")]
    assert cfg.model.image_encoder == "preset-flat" and "preset-flat" in image_encoder_names()


def test_a_saved_config_with_another_loss_kinds_options_loads_where_that_kind_is_missing(tmp_path, fresh):
    """A driver that has a plugin's loss kind writes its options (at their defaults) into every config it hands
    on; a worker without that plugin still builds a config whose loss kind is another one, and refuses one whose
    loss kind is the missing one."""
    from raydist.config import from_saved
    from raydist.losses import LOSSES

    plugin = tmp_path / EXAMPLE.name
    plugin.write_text(EXAMPLE.read_text())
    load_plugins([str(plugin)])
    saved = apply_overrides(Config(), {"loss.margin": "0.3"}).to_dict()
    assert saved["loss"]["neg_margin"] == 0.5  # the plugin's option, at its default
    mine = apply_overrides(Config(), {"loss.kind": "contrastive"}).to_dict()
    LOSSES.unregister("contrastive")  # a process without the plugin
    cfg = from_saved(saved)
    assert cfg.loss.margin == 0.3 and not hasattr(cfg.loss, "neg_margin")
    with pytest.raises(ValueError, match="unknown loss kind 'contrastive'"):
        from_saved(mine)
    with pytest.raises(ValueError, match="unknown config key 'loss.pos_margin'"):
        from_dict(saved)  # what a user writes is still checked strictly


LOSS_PLUGIN = """
from pydantic import BaseModel

from raydist.losses import LossKind, register_loss


@register_loss
class Scaled(LossKind):
    name = "{name}"
    task = "labels"

    class Options(BaseModel):
        {name}_scale: float = 1.0
"""


def test_the_loaders_import_a_configs_plugins_and_validation_alone_does_not(tmp_path, fresh):
    """Importing a config's plugins is one step the loaders take before they validate (a plugin's loss kind adds
    keys); set_keys only validates, so a key of a plugin not yet imported is unknown there."""
    from raydist.config import ConfigError, from_saved, import_plugins, load_config, set_keys

    name = "scaled_" + tmp_path.name.replace("-", "_").lower()
    plugin = write(tmp_path / f"{name}.py", LOSS_PLUGIN.format(name=name))
    values = {"plugins": str(plugin), "loss.kind": name, f"loss.{name}_scale": "2"}
    with pytest.raises(ConfigError, match=f"unknown config key 'loss.{name}_scale'"):
        set_keys(Config(), values)
    assert name not in sys.modules
    assert import_plugins(values)["plugins"] == [str(plugin)] and name in sys.modules
    cfg = set_keys(Config(), import_plugins(values))
    assert getattr(cfg.loss, f"{name}_scale") == 2.0
    assert apply_overrides(Config(), values) == cfg == from_saved(cfg.to_dict())
    assert load_config(overrides=values) == cfg
