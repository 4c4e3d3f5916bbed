"""The package's layers point one way (docs/architecture.md, "Layers"): a module imports only from its own
layer or a lower one -- at the top of the file or inside a function alike -- no import circle exists, counting
a package's ``__init__`` as a module, and no module sits in a package of a higher layer (importing a module
runs every ``__init__`` above it, so that would be an arrow back up). Read from the source with ``ast``, so
nothing is imported."""

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
            "raydist.malloc",
            "raydist.tune",
            "raydist.runtime",
        ),
    ),
    (
        "metrics and statistics",
        ("raydist.eval", "raydist.retrieval", "raydist.gradclust", "raydist.plots"),
    ),
    ("tasks", ("raydist.tasks", "raydist.recipe")),
    (
        "trained models",
        (
            "raydist.retrieval.trained",
            "raydist.retrieval.embedder",
            "raydist.retrieval.query",
            "raydist.retrieval.corpus",
            "raydist.retrieval.zero_shot",
            "raydist.extract",
            ROOT,
        ),
    ),
    ("serving", ("raydist.serving",)),
    ("loop and hooks", ("raydist.train",)),
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
            "raydist.tune.sweep",
            "raydist.tune.auto",
            "raydist.benchmarks",
            "raydist.experiments",
            "raydist.simcluster",
            "raydist.local_s3",
            "raydist.autoscaling",
            "raydist.presets.table",
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


def packages_above(name: str) -> list[str]:
    """The packages whose ``__init__`` runs when ``name`` is imported, innermost first (the root's apart:
    :func:`test_the_root_imports_nothing_when_imported`)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 1, -1)]


def sunk_modules(names: list[str]) -> list[str]:
    """Modules in a lower layer than a package that contains them."""
    return [
        f"{m} ({LAYERS[layer_of(m)][0]}) sits in {p} ({LAYERS[layer_of(p)][0]})"
        for m in sorted(names)
        for p in packages_above(m)
        if layer_of(m) < layer_of(p)
    ]


def import_time_imports(path: Path) -> list[str]:
    """The raydist modules a file imports while it is being imported: statements of its body, not those inside
    a function or an ``if TYPE_CHECKING:`` block."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Import):
                found += [a.name for a in sub.names if a.name.startswith(ROOT)]
            elif isinstance(sub, ast.ImportFrom) and (sub.level or (sub.module or "").startswith(ROOT)):
                found.append(sub.module or ".")
    return found


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


def test_no_module_sits_in_a_package_of_a_higher_layer():
    """Every package lives in one layer, or its modules sit above it (``train/wiring`` in ``train``); never
    below (a ``train/malloc`` in the formats layer would load the training package to tune malloc)."""
    assert sunk_modules(list(modules())) == []


def test_the_root_imports_nothing_when_imported():
    """``raydist/__init__`` runs for every module, so it imports none at import time (``raydist.Embedder``
    is loaded by its ``__getattr__`` on first use); its layer is that of the lazy import."""
    assert import_time_imports(PACKAGE / "__init__.py") == []


def test_the_checks_can_fail(tmp_path, monkeypatch):
    """A planted upward import, a planted circle, a module sunk below its package and a root that imports at
    import time are all caught."""
    g = {"raydist.config": {"raydist.tasks"}, "raydist.tasks": {"raydist.config"}}
    assert cycles(g) == [["raydist.config", "raydist.tasks"]]
    assert layer_of("raydist.tasks") > layer_of("raydist.config")
    planted = [
        (layer, (*names, "raydist.train.malloc") if i == 1 else names)
        for i, (layer, names) in enumerate(LAYERS)
    ]
    monkeypatch.setattr(__import__(__name__), "LAYERS", planted)
    assert sunk_modules(["raydist.train.malloc", "raydist.train.wiring", "raydist.malloc"]) == [
        "raydist.train.malloc (formats and numerics) sits in raydist.train (loop and hooks)"
    ]
    pkg = tmp_path / "raydist"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("def f():\n    from raydist.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from . import a\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", pkg)
    assert cycles(graph()) == [["raydist.sub.a", "raydist.sub.b"]]
    (pkg / "__init__.py").write_text(
        "from raydist.sub import a\nif TYPE_CHECKING:\n    from raydist import sub\n"
    )
    assert import_time_imports(pkg / "__init__.py") == ["raydist.sub"]


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_has_a_layer(name):
    layer_of(name)
