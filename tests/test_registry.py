"""raydist.registry: a registry made with ``package=`` imports that package's modules the first time it is read,
so a module dropped into the package registers without a list naming it."""

from __future__ import annotations

import sys

import pytest

from raydist.registry import Registry, RegistryError, registries


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A fresh package ``dropin_pkg`` on sys.path; the registries the test makes are removed after it."""
    root = tmp_path / "dropin_pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(registries())
    yield root
    for kind in set(registries()) - before:
        registries.__globals__["_REGISTRIES"].pop(kind)
    for name in [m for m in sys.modules if m.split(".")[0] == "dropin_pkg"]:
        del sys.modules[name]


def test_a_module_dropped_into_the_package_is_found_when_the_registry_is_read(package):
    reg: Registry = Registry("dropin thing", package="dropin_pkg")
    (package / "first.py").write_text(
        "from raydist.registry import registry\n\n\n@registry('dropin thing').register('one')\ndef one():\n    return 1\n"
    )
    (package / "second.py").write_text(
        "from raydist.registry import registry\nregistry('dropin thing').register('two', 2)\n"
    )
    (package / "_private.py").write_text("raise RuntimeError('a module starting with _ is not imported')\n")
    assert "dropin_pkg.first" not in sys.modules  # nothing imported before the first read
    assert reg.get("two") == 2 and reg.get("one")() == 1
    assert reg.names() == ["one", "two"]
    assert reg.module_of("one") == "dropin_pkg.first"


def test_a_module_that_cannot_be_imported_is_named(package):
    reg: Registry[int] = Registry("dropin broken", package="dropin_pkg")
    (package / "broken.py").write_text("import no_such_module_anywhere\n")
    with pytest.raises(RegistryError, match=r"dropin_pkg\.broken cannot be imported"):
        reg.names()


def test_a_registry_without_a_package_imports_nothing(package):
    reg: Registry[int] = Registry("dropin plain")
    (package / "first.py").write_text("raise RuntimeError('not imported')\n")
    assert reg.names() == [] and "x" not in reg
