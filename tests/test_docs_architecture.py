"""docs/architecture.md's module map matches the tree of raydist/.

The map is the fenced block under "## Module map": ``raydist/``, then one entry a line, ``name.py`` or
``name/`` as the line's first word, two spaces deeper per level; deeper lines without an entry go on describing
the entry above. The rule:

- every top-level module and every package of raydist/ (at any depth) is an entry of the map, in the block of
  its parent package (a top-level one at the first level);
- every entry exists: a ``name.py`` entry is a module of its parent package, a ``name/`` entry a package;
- every ``name.py`` named anywhere in a package's block (its entry line, its description, its entries') is a
  module of that package, and every ``dir/name.py`` a file under raydist/.

Modules inside a package need not all be named (the map says what a package owns; its docstrings say the rest).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "raydist"
DOC = ROOT / "docs" / "architecture.md"

ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[A-Za-z_]\w*(?:\.py|/))(?:\s|$)")
MENTION = re.compile(r"(?<![\w/.])(?P<path>(?:[A-Za-z_]\w*/)*[A-Za-z_]\w*\.py)\b")


def module_map(text: str) -> str:
    """The fenced block under the "## Module map" heading."""
    section = text.split("\n## Module map", 1)[1]
    return section.split("```", 2)[1]


def read_map(block: str) -> tuple[set[str], list[tuple[str, str]]]:
    """(entries as paths under raydist/ -- ``data/`` for a package, ``data/schema.py`` for a module --, and every
    mention as (the package whose block it is in, the name as written))."""
    lines = block.strip("\n").splitlines()
    assert lines[0].strip() == "raydist/", "the module map starts with raydist/"
    entries: set[str] = set()
    mentions: list[tuple[str, str]] = []
    stack: list[tuple[int, str]] = [(0, "")]  # (indent of the entry, package path "" or "data/")
    for line in lines[1:]:
        m = ENTRY.match(line)
        depth = len(line) - len(line.lstrip(" "))
        if m and len(m["indent"]) % 2 == 0 and len(m["indent"]) <= 2 * len(stack):
            indent = len(m["indent"])
            while stack and stack[-1][0] >= indent:
                stack.pop()
            parent = stack[-1][1] if stack else ""
            path = parent + m["name"]
            entries.add(path)
            if path.endswith("/"):
                stack.append((indent, path))
            rest = line[m.end("name") :]
            package = path if path.endswith("/") else parent
        else:
            while len(stack) > 1 and stack[-1][0] >= depth:
                stack.pop()
            rest, package = line, stack[-1][1]
        mentions += [(package, name) for name in MENTION.findall(rest)]
    return entries, mentions


def map_problems(block: str, package_dir: Path) -> list[str]:
    """What the map names that does not exist, and what exists that the map leaves out."""
    entries, mentions = read_map(block)
    problems = []
    for entry in sorted(entries):
        if not (
            package_dir / entry / "__init__.py" if entry.endswith("/") else package_dir / entry
        ).is_file():
            problems.append(
                f"the map names {entry}, which is not a {'package' if entry.endswith('/') else 'module'}"
            )
    for package, name in mentions:
        if name.startswith("tests/"):
            continue
        where = package_dir / name if "/" in name else package_dir / package / name
        if not where.is_file():
            problems.append(f"the map names {name} in {package or 'raydist/'}, which does not exist")
    wanted = {f"{p.name}" for p in package_dir.glob("*.py") if p.name != "__init__.py"}
    wanted |= {
        f"{p.parent.relative_to(package_dir).as_posix()}/"
        for p in package_dir.rglob("__init__.py")
        if p.parent != package_dir
    }
    problems += [f"the map leaves out {name}" for name in sorted(wanted - entries)]
    return sorted(set(problems))


def test_the_module_map_matches_the_tree():
    assert map_problems(module_map(DOC.read_text()), PACKAGE) == []


def test_the_check_can_fail(tmp_path):
    """A module named that does not exist, one left out, a package left out and a mention in a package's
    block that is not there are all reported; a correct map is not."""
    pkg = tmp_path / "raydist"
    for folder in (pkg, pkg / "data", pkg / "data" / "io"):
        folder.mkdir()
        (folder / "__init__.py").write_text("")
    for name in ("config.py", "uris.py", "data/schema.py", "data/io/read.py"):
        (pkg / name).write_text("")
    good = (
        "\nraydist/\n  config.py   models (see uris.py)\n  uris.py     paths\n  data/       the format: schema.py\n"
        "    io/       read.py\n"
    )
    assert map_problems(good, pkg) == []
    bad = "\nraydist/\n  config.py   models\n  names.py    gone\n  data/       the format: shards.py\n"
    assert map_problems(bad, pkg) == [
        "the map leaves out data/io/",
        "the map leaves out uris.py",
        "the map names names.py, which is not a module",
        "the map names shards.py in data/, which does not exist",
    ]
