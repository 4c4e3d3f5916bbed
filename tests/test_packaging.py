"""Packaging: a built wheel holds the package, the shipped spaces (tune_spaces/) and the job entry points
(jobs/), and runs them from outside the checkout; the editable install maps the same folders; every
third-party module imported in raydist/ or jobs/ is a declared dependency or extra. No Ray here."""

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from raydist.tune.space import shipped_space_file, space_names

ROOT = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ["pyproject.toml", "setup.py", "README.md", "raydist", "tune_spaces", "jobs"]
# Where the wheel puts each source folder (the rest of raydist/ keeps its place).
INSTALLED_AS = {"raydist": "raydist", "tune_spaces": "raydist/tune_spaces", "jobs": "raydist/jobs"}
# Import names that differ from their distribution's name, for modules an environment may lack (CI installs only
# the dev extra); for installed modules importlib.metadata names the distributions.
DISTRIBUTION_NAMES = {"yaml": "pyyaml", "PIL": "pillow", "sklearn": "scikit-learn", "faiss": "faiss-cpu"}


def source_files(top: Path) -> dict[str, Path]:
    """The files of the package folders under ``top``, keyed by their path inside an installed wheel."""
    files = {}
    for folder, installed in INSTALLED_AS.items():
        for path in (top / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                files[f"{installed}/{path.relative_to(top / folder).as_posix()}"] = path
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel built from a copy of the checkout's build inputs, that copy); built offline, with the
    installed setuptools, outside the checkout so concurrent builds never share a build/ folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copy2(ROOT / name, src / name)
    out = tmp / "dist"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-q",
        "-w",
        str(out),
        str(src),
    ]
    done = subprocess.run(
        cmd,
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("raydist-*.whl")
    return built, src


def test_the_wheel_holds_the_package_the_spaces_and_the_jobs(wheel):
    built, src = wheel
    with zipfile.ZipFile(built) as z:
        shipped = {n: z.read(n) for n in z.namelist() if n.startswith("raydist/")}
    expected = source_files(src)
    assert {"raydist/tune_spaces/margin.yaml", "raydist/jobs/train.py", "raydist/presets/tiny.yaml"} <= set(
        expected
    )
    assert sorted(shipped) == sorted(expected)
    assert all(shipped[name] == path.read_bytes() for name, path in expected.items())


def run_installed(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """Python with only the unpacked wheel added to its path, run from ``cwd`` (not the checkout)."""
    env = {**os.environ, "PYTHONPATH": str(site), "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run(
        [sys.executable, *args], check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


LOAD_MARGIN = """
import json, raydist, raydist.jobs
from raydist.tune.space import load_space, resolve_base_config, shipped_space_file
space = load_space("margin")
cfg = resolve_base_config(space, preset="tiny")
print(json.dumps({"raydist": raydist.__file__, "jobs": raydist.jobs.__file__, "file": str(shipped_space_file("margin")),
                  "name": space.name, "source": space.source, "epochs": cfg.train.epochs}))
"""


def test_a_shipped_space_and_a_job_run_from_the_installed_wheel(wheel, tmp_path):
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    zipfile.ZipFile(wheel[0]).extractall(site)
    elsewhere.mkdir()
    done = run_installed(site, elsewhere, "-c", LOAD_MARGIN)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("raydist", "jobs", "file"):  # imported from the wheel, not the checkout's editable install
        assert Path(got[key]).is_relative_to(site), (key, got[key])
    margin = yaml.safe_load((ROOT / "tune_spaces" / "margin.yaml").read_text())
    assert (got["name"], got["source"], got["epochs"]) == ("margin", margin, margin["base"]["train.epochs"])

    job = run_installed(site, elsewhere, "-m", "raydist.jobs.tune", "--help")
    assert job.returncode == 0, job.stderr
    assert "shipped space by name" in job.stdout


def test_the_editable_install_maps_the_checkout_folders():
    assert shipped_space_file("margin") == ROOT / "tune_spaces" / "margin.yaml"
    assert space_names() == sorted(p.stem for p in (ROOT / "tune_spaces").glob("*.yaml"))
    assert Path(importlib.util.find_spec("raydist.jobs.train").origin) == ROOT / "jobs" / "train.py"


def imported_modules(folders: list[Path]) -> dict[str, set[str]]:
    """Top-level names of the absolute imports in every ``.py`` file under ``folders`` → the files."""
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.partition(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def normalized(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def declared_distributions(built: Path) -> set[str]:
    """The distributions a wheel's METADATA requires (``Requires-Dist``: dependencies and every extra)."""
    with zipfile.ZipFile(built) as z:
        (metadata,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        lines = z.read(metadata).decode().splitlines()
    requirements = [
        line.removeprefix("Requires-Dist:").strip() for line in lines if line.startswith("Requires-Dist:")
    ]
    return {normalized(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in requirements}


def test_every_third_party_import_is_a_declared_dependency(wheel):
    installed = importlib.metadata.packages_distributions()
    third_party = {
        name: files
        for name, files in imported_modules([ROOT / "raydist", ROOT / "jobs"]).items()
        if name not in sys.stdlib_module_names and name not in ("raydist", "__future__")
    }
    assert {"torch", "ray", "yaml", "pydantic"} <= set(third_party)  # the scan sees the package's imports
    declared = declared_distributions(wheel[0])
    undeclared = {}
    for name, files in sorted(third_party.items()):
        distributions = {*installed.get(name, []), DISTRIBUTION_NAMES.get(name, name)}
        if not declared & {normalized(d) for d in distributions}:
            undeclared[name] = (sorted(distributions), sorted(files))
    assert not undeclared, (
        f"imported but not declared in pyproject.toml (dependencies or an extra): {undeclared}"
    )
