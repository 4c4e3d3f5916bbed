"""The package's layers point one way (docs/architecture.md, "Layers"): a module imports only from its own
layer or a lower one -- at the top of the file or inside a function alike -- and no import circle exists,
counting a package's ``__init__`` as a module. Read from the source with ``ast``, so nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "raydist"

# Lowest first. A module belongs to the layer of its longest matching prefix; ROOT (the package's own
# __init__, which exports raydist.Embedder lazily) matches only itself.
ROOT = "raydist"
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundation",
        (
            "raydist.config",
            "raydist.dataset_task",
            "raydist.console",
            "raydist.runfiles",
            "raydist.choices",
            "raydist.nesting",
            "raydist.presets",
            "raydist.uris",
            "raydist.registry",
            "raydist.plugins",
        ),
    ),
    (
        "formats and numerics",
        (
            "raydist.data",
            "raydist.converters",
            "raydist.losses",
            "raydist.models",
            "raydist.distributed",
            "raydist.checkpoint",
            "raydist.train.malloc",
            "raydist.tune.space",
            "raydist.runtime",
        ),
    ),
    ("metrics and statistics", ("raydist.eval", "raydist.gradclust", "raydist.plots")),
    ("tasks", ("raydist.tasks", "raydist.recipe")),
    ("trained models", ("raydist.inference", "raydist.extract", ROOT)),
    ("serving", ("raydist.serving",)),
    ("loop and hooks", ("raydist.train", "raydist.train.hooks", "raydist.gradclust.hook")),
    (
        "wiring and Ray Train",
        (
            "raydist.train.wiring",
            "raydist.train.ray_worker",
            "raydist.train.trainer",
            "raydist.train.elastic",
        ),
    ),
    (
        "drivers",
        (
            "raydist.tune",
            "raydist.benchmarks",
            "raydist.experiments",
            "raydist.simcluster",
            "raydist.local_s3",
            "raydist.autoscaling",
            "raydist.train.preset_table",
        ),
    ),
    ("command line", ("raydist.cli",)),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """raydist modules that ``name`` imports anywhere in its file (``from pkg import mod`` names the
    module ``pkg.mod`` when it is one, else the package ``pkg``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("raydist"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def layer_of(name: str) -> int:
    best = max(
        (
            (len(prefix), i)
            for i, (_, prefixes) in enumerate(LAYERS)
            for prefix in prefixes
            if name == prefix or (prefix != ROOT and name.startswith(prefix + "."))
        ),
        default=None,
    )
    if best is None:
        raise AssertionError(f"{name} is in no layer: add it to LAYERS (and docs/architecture.md)")
    return best[1]


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert cycles(graph()) == []


def test_layers_point_one_way():
    g = graph()
    upward = [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
        for m in sorted(g)
        for t in sorted(g[m])
        if layer_of(t) > layer_of(m)
    ]
    assert upward == []


def test_the_checks_can_fail(tmp_path, monkeypatch):
    """A planted upward import and a planted circle are both caught."""
    g = {"raydist.config": {"raydist.tasks"}, "raydist.tasks": {"raydist.config"}}
    assert cycles(g) == [["raydist.config", "raydist.tasks"]]
    assert layer_of("raydist.tasks") > layer_of("raydist.config")
    pkg = tmp_path / "raydist"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("def f():\n    from raydist.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from . import a\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", pkg)
    assert cycles(graph()) == [["raydist.sub.a", "raydist.sub.b"]]


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_has_a_layer(name):
    layer_of(name)
