"""The CLI package and its plugins (issue #38): every command takes ``--plugin``; a plugin file written here (in a
temporary folder, importable no other way) registers an image encoder, a converter and a benchmark, which
``raydist plugins`` lists with the plugin's module, ``raydist convert`` and ``raydist bench`` run, and a run's
config keeps; a broken plugin is one error line and exit 2. No Ray."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import pytest
import yaml

from raydist.cli import COMMANDS, build_parser, main, parse_args
from raydist.cli.common import with_plugins
from raydist.registry import registries

_count = itertools.count()

PLUGIN = '''
import argparse

from raydist.benchmarks import register_benchmark
from raydist.converters import Converter, register_converter
from raydist.models.image_encoders import Backbone, register_image_encoder


@register_image_encoder("{name}-enc")
def build(*, in_dim, channels, image_size, **options):
    import torch.nn as nn

    return Backbone(nn.Flatten(), in_dim or channels, ())


@register_converter("{name}-conv")
class TinySynthetic(Converter):
    """A plugin's converter: a tiny synthetic pairs set."""

    requires = ("images",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--images", type=int, help="train images")

    def run(self, args):
        from raydist.data import make_synthetic

        return make_synthetic(
            args.out, images=args.images, val_images=4, test_images=4, dim=4, overwrite=args.overwrite
        )


@register_benchmark("{name}-bench")
def tiny(*, smoke: bool, repeats: int) -> str:
    """A plugin's benchmark."""
    return "| smoke | repeats |\\n|---|---|\\n| {{}} | {{}} |".format(smoke, repeats)
'''


@pytest.fixture
def plugin(tmp_path: Path):
    """A plugin file with a module name of its own (the test process imports each once); its registrations are
    removed afterwards, so the other tests see the shipped registries."""
    name = f"cliplug{next(_count)}_{tmp_path.name.replace('-', '_')}".lower()
    path = tmp_path / f"{name}.py"
    path.write_text(PLUGIN.format(name=name))
    yield name, path
    for reg in registries().values():
        for entry in list(reg.entries()):
            if entry.module == name:
                reg.unregister(entry.name)


def test_the_table_is_the_parser_and_every_command_takes_plugins():
    commands = build_parser().parse_args(["train"]).commands
    assert list(commands) == [c.name for c in COMMANDS] and len(set(commands)) == len(COMMANDS)
    parsers = [*commands.values(), *commands["convert"].get_default("commands").values()]
    assert len(parsers) > len(COMMANDS)  # the converters' own parsers too
    for parser in parsers:
        assert any("--plugin" in a.option_strings for a in parser._actions), parser.prog
    args = parse_args(["eval", "--plugin", "a.py", "--checkpoint", "c", "--plugin", "mod.x"])
    assert args.plugin == ["a.py", "mod.x"] and args.checkpoint == "c"


def test_convert_lists_its_converters_and_each_shows_only_its_own_options(capsys):
    def shown(*argv: str) -> str:
        with pytest.raises(SystemExit) as info:
            main(["convert", *argv, "--help"])
        assert info.value.code == 0
        return " ".join(capsys.readouterr().out.split())

    listing = shown()
    for name in ("karpathy", "coco-json", "image-folder", "npz", "vsepp-precomp"):
        assert f" {name} " in listing
    assert "Karpathy's dataset_*.json (Flickr8k, Flickr30k, COCO)" in listing
    karpathy = shown("karpathy")
    assert {"--out", "--src", "--images", "--min-count", "--overwrite", "--plugin"} <= set(karpathy.split())
    for other in ("--split-by", "--standardize", "--captions", "--features", "--splits", "--val-fraction"):
        assert other not in karpathy
    assert "--split-by" in shown("image-folder") and "--standardize" in shown("npz")


def test_raydist_plugins_lists_a_plugins_components_with_its_module(plugin, capsys):
    name, path = plugin
    assert main(["plugins", "--plugin", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"plugins loaded: {path}" in out
    rows = {tuple(line.split()) for line in out.splitlines() if line.startswith("  ")}
    assert {(f"{name}-enc", name), (f"{name}-conv", name), (f"{name}-bench", name)} <= rows
    # the shipped ones, each with the module that registered it
    assert {
        ("small-cnn", "raydist.models.image_encoders"),
        ("timm:<model>", "raydist.models.image_encoders"),
    } <= rows
    assert {("karpathy", "raydist.converters.karpathy"), ("loss", "raydist.benchmarks.loss")} <= rows
    assert {("pairs", "raydist.tasks.pairs"), ("labels", "raydist.tasks.labels")} <= rows
    kinds = [line.rsplit(" (", 1)[0] for line in out.splitlines()[1:] if not line.startswith(" ")]
    assert {"task", "image encoder", "text encoder", "converter", "benchmark"} <= set(kinds)

    assert main(["plugins", "--kind", "image-encoder"]) == 0
    out = capsys.readouterr().out.splitlines()
    encoders = [line for line in out if line.startswith("  ")]
    assert out[1].startswith("image encoder (") and all(not line.startswith("converter") for line in out)
    assert any(line.split()[0] == f"{name}-enc" for line in encoders)  # loaded once, it stays registered
    assert main(["plugins", "--kind", "nope"]) == 2
    assert "no registry of kind 'nope'" in capsys.readouterr().err


def test_a_plugins_converter_has_its_own_options_and_runs(plugin, tmp_path, capsys):
    name, path = plugin
    with pytest.raises(SystemExit) as info:
        main(["convert", "--plugin", str(path), f"{name}-conv", "--help"])
    assert info.value.code == 0
    shown = capsys.readouterr().out
    assert "A plugin's converter" in shown and "--images" in shown and "--src" not in shown
    out = tmp_path / "syn"
    argv = ["convert", "--plugin", str(path), f"{name}-conv", "--out", str(out)]
    assert main(argv) == 2 and f"convert {name}-conv: give --images" in capsys.readouterr().err
    assert main([*argv, "--images", "12"]) == 0
    assert f"wrote dataset {out}" in capsys.readouterr().out and (out / "manifest.json").is_file()


def test_a_plugins_benchmark_runs_by_name(plugin, capsys):
    name, path = plugin
    assert main(["bench", "--smoke", "--plugin", str(path), f"{name}-bench"]) == 0
    out = capsys.readouterr().out
    assert f"### {name}-bench (smoke): A plugin's benchmark." in out and "| True | 1 |" in out


def test_a_runs_config_keeps_its_plugins(plugin, tmp_path, capsys, monkeypatch):
    """--plugin is added after the config's own plugins (the preset file's, or a plugins= override), resolved,
    without duplicates; the printed config is what the run saves."""
    _, path = plugin
    monkeypatch.chdir(tmp_path)
    preset = tmp_path / "mine.yaml"
    preset.write_text(yaml.safe_dump({"plugins": [path.name], "train": {"epochs": 1}}))
    argv = [
        "train",
        "--preset-file",
        str(preset),
        "--print-config",
        "--plugin",
        "json",
        "--plugin",
        path.name,
    ]
    assert main(argv) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["plugins"] == [str(path), "json"] and cfg["train"]["epochs"] == 1
    assert main([*argv, "plugins=[]"]) == 0  # an override replaces the preset's list; --plugin still added
    assert yaml.safe_load(capsys.readouterr().out)["plugins"] == ["json", str(path)]


def test_with_plugins_appends_to_the_configs_own_list():
    args = argparse.Namespace(plugin=["b.py", "mod"])
    b = str(Path("b.py").resolve())
    assert with_plugins({}, argparse.Namespace(plugin=None), ["x"]) == {}  # nothing added: unchanged
    assert with_plugins({"k": 1}, args, ["mod", "a"])["plugins"] == ["mod", "a", b]
    assert with_plugins({"plugins": "[c]"}, args, ["a"])["plugins"] == ["c", b, "mod"]
    assert with_plugins({"plugins": "c"}, args)["plugins"] == ["c", b, "mod"]


def test_a_broken_plugin_is_one_error_line_before_anything_runs(tmp_path, capsys):
    bad = tmp_path / "broken_plugin_cli.py"
    bad.write_text("import json\nraise RuntimeError('boom in the plugin')\n")
    assert main(["train", "--plugin", str(bad), "--data", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"raydist: error: plugin {bad}: import failed: RuntimeError")
    assert main(["plugins", "--plugin", str(tmp_path / "absent.py")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["validate", "x", "--plugin", "no_such_module_here"]) == 2
    assert "no module named 'no_such_module_here'" in capsys.readouterr().err


def test_a_new_module_in_the_packages_is_found_without_a_list(tmp_path, monkeypatch, capsys):
    """Adding a converter or a benchmark is one file in its package: its registry finds it when first read (here
    the packages' path gets a temporary folder, so that the checkout is not written, and the registries are
    unread, as in a fresh process)."""
    import raydist.benchmarks
    import raydist.converters
    from raydist.benchmarks import BENCHMARKS, benchmark_names
    from raydist.converters import CONVERTERS

    tag = tmp_path.name.replace("-", "_").lower()
    conv, bench = tmp_path / "conv", tmp_path / "bench"
    conv.mkdir()
    bench.mkdir()
    (conv / f"new_{tag}.py").write_text(
        "from raydist.converters import Converter, register_converter\n\n\n"
        f'@register_converter("new-{tag}")\nclass New(Converter):\n    """One new layout."""\n'
    )
    (bench / f"new_{tag}.py").write_text(
        "from raydist.benchmarks import register_benchmark\n\n\n"
        f'@register_benchmark("new-{tag}")\ndef new(*, smoke, repeats):\n    """One new benchmark."""\n'
        '    return "| x |\\n|---|\\n| 1 |"\n'
    )
    for package, folder, registry in (
        (raydist.converters, conv, CONVERTERS),
        (raydist.benchmarks, bench, BENCHMARKS),
    ):
        path = [*package.__path__, str(folder)]
        monkeypatch.setattr(package, "__path__", path)  # where the import looks
        monkeypatch.setattr(package.__spec__, "submodule_search_locations", path)  # where discovery lists
        monkeypatch.setattr(registry, "_discovered", False)
    try:
        assert f"new-{tag}" in CONVERTERS.names()
        assert CONVERTERS.module_of(f"new-{tag}") == f"raydist.converters.new_{tag}"
        assert benchmark_names()[-1] == f"new-{tag}"  # no order: after the shipped ones
        with pytest.raises(SystemExit):
            main(["convert", "--help"])
        shown = capsys.readouterr().out
        assert f"new-{tag}" in shown and "One new layout." in shown
    finally:
        CONVERTERS.unregister(f"new-{tag}")
        BENCHMARKS.unregister(f"new-{tag}")


def _tiny_run(tmp_path: Path, *extra: str) -> int:
    """``raydist train`` in process on a tiny pairs set, as run ``r`` under ``tmp_path/runs``."""
    from raydist.data import make_synthetic

    data = make_synthetic(tmp_path / "d", images=64, val_images=16, test_images=16, dim=8, seed=0)
    runs, fixed = tmp_path / "runs", ["--name", "r", "train.num_workers=0", "train.epochs=1"]
    return main(["train", "--preset", "tiny", "--data", f"{data}", "--storage", f"{runs}", *fixed, *extra])


def test_a_resumed_run_keeps_its_plugins_and_adds_new_ones(plugin, tmp_path, capsys):
    from raydist.checkpoint.io import find_checkpoint

    _, path = plugin
    assert _tiny_run(tmp_path) == 0
    saved = find_checkpoint(tmp_path / "runs" / "r") / "config.yaml"  # as a run with the plugin saves it
    saved.write_text(saved.read_text().replace("plugins: []", f"plugins: ['{path}']"))
    capsys.readouterr()
    assert (
        main(["train", "--resume", str(tmp_path / "runs" / "r"), "--plugin", "json", "--print-config"]) == 0
    )
    out = capsys.readouterr().out
    assert f"changed: plugins: ['{path}'] -> ['{path}', 'json']" in out
    assert yaml.safe_load(out.split("\n", 1)[1])["plugins"] == [str(path), "json"]


def test_a_run_with_a_plugin_trains(plugin, tmp_path, capsys):
    _, path = plugin
    assert _tiny_run(tmp_path, "--plugin", str(path)) == 0, capsys.readouterr().err
