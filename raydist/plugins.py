"""Plugins: a user's Python file, package folder or importable module that registers components (encoders,
losses, tasks, converters, hooks, benchmarks -- :mod:`raydist.registry`) when imported.

Named by ``--plugin PATH_OR_MODULE`` or the ``plugins: [...]`` config key, and found in the ``raydist.plugins``
entry-point group of installed packages. :func:`load_plugins` imports them once per process: in the driver
before anything is built (an import error is a :class:`PluginError` naming the plugin, before Ray starts), and
again in every Ray process that builds from a config (Train workers, Tune trial drivers, Serve replicas).

A file ``my_loss.py`` is imported as the module ``my_loss``, a folder ``pkg/`` (with ``__init__.py``) as
``pkg``. They reach the other nodes of a cluster through Ray's ``runtime_env`` ``py_modules``
(:func:`plugin_runtime_env`), which makes them importable under the same names there.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
import sysconfig
import traceback
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType

ENTRY_POINT_GROUP = "raydist.plugins"

_loaded: dict[str, ModuleType] = {}  # spec (as given, resolved) -> module
_entry_points_loaded = False


class PluginError(ValueError):
    """A plugin that cannot be found or imported."""


def is_path(spec: str) -> bool:
    """Whether a plugin spec names a file or folder (``x.py``, ``./pkg``, ``/abs/dir``) rather than a module."""
    return spec.endswith(".py") or os.sep in spec or "/" in spec or Path(spec).is_dir()


def resolve_spec(spec: str, base: str | Path | None = None) -> str:
    """A plugin spec as stored in a config: a path made absolute (relative to ``base``, default the working
    directory), a module name as it is."""
    spec = str(spec).strip()
    if not spec:
        raise PluginError("plugin: empty name (expected a .py file, a package folder or a module name)")
    if not is_path(spec):
        return spec
    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = Path(base or Path.cwd()) / path
    return str(path.resolve())


def module_name(spec: str) -> str:
    """The module a spec is imported as: a file's stem, a folder's name, or the module name itself."""
    return Path(spec).stem if is_path(spec) else spec


def _check_path(spec: str) -> Path:
    path = Path(spec)
    if not path.exists():
        raise PluginError(f"plugin {spec}: no such file or folder")
    if path.is_dir() and not (path / "__init__.py").is_file():
        raise PluginError(f"plugin {spec}: a plugin folder must be a package (it has no __init__.py)")
    if path.is_file() and path.suffix != ".py":
        raise PluginError(f"plugin {spec}: expected a .py file, a package folder or a module name")
    name = module_name(spec)
    if not name.isidentifier():
        raise PluginError(f"plugin {spec}: {name!r} is not a valid module name (rename the file)")
    return path


def _failure(spec: str, error: BaseException) -> PluginError:
    """The error for a plugin whose import raised: its name, the error and the line in the plugin."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "importlib" not in f.filename]
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return PluginError(f"plugin {spec}: import failed: {type(error).__name__}: {error}{where}")


def _same_source(found: str | None, path: Path) -> bool:
    """Whether the module file ``found`` is ``path`` or a copy of it (the one Ray's py_modules shipped)."""
    if not found:
        return False
    found_path = Path(found)
    source = path / "__init__.py" if path.is_dir() else path
    try:
        return found_path.resolve() == source.resolve() or found_path.read_bytes() == source.read_bytes()
    except OSError:
        return False


def _in_ray_worker() -> bool:
    """Whether this process is a Ray worker (a Train worker, a Tune trial, a replica), not a driver."""
    if "ray" not in sys.modules:
        return False
    try:
        from ray._private.worker import WORKER_MODE, global_worker
    except ImportError:
        return False
    return getattr(global_worker, "mode", None) == WORKER_MODE


def _import_path(spec: str) -> ModuleType:
    """Import a file or package folder under :func:`module_name`: the copy on ``sys.path`` when there is one
    (shipped by Ray to this node), else from the path itself."""
    name = module_name(spec)
    path = Path(spec)
    if name in sys.modules:
        module = sys.modules[name]
        if path.exists() and not _same_source(getattr(module, "__file__", None), path):
            raise PluginError(
                f"plugin {spec}: the module name {name!r} is taken by {getattr(module, '__file__', module)} "
                "(rename the plugin)"
            )
        return module
    found = importlib.util.find_spec(name)
    if found is not None and (not path.exists() or _same_source(found.origin, path)):
        return importlib.import_module(name)
    if not path.exists() and not _in_ray_worker():
        raise PluginError(f"plugin {spec}: no such file or folder")
    if not path.exists():
        raise PluginError(
            f"plugin {spec}: not on this node, and no module {name!r} was shipped here (raydist ships plugins "
            "when it starts or joins Ray; a ray.init of your own needs runtime_env=raydist.plugins."
            "plugin_runtime_env(...))"
        )
    if found is not None:
        raise PluginError(
            f"plugin {spec}: it would be imported as {name!r}, which is another module ({found.origin}); "
            "rename the plugin"
        )
    _check_path(spec)
    location = path / "__init__.py" if path.is_dir() else path
    module_spec = importlib.util.spec_from_file_location(
        name, location, submodule_search_locations=[str(path)] if path.is_dir() else None
    )
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_plugin(spec: str) -> ModuleType:
    """Import one plugin (once per process); a failure is a :class:`PluginError` naming it."""
    spec = resolve_spec(spec)
    if spec in _loaded:
        return _loaded[spec]
    try:
        module = _import_path(spec) if is_path(spec) else importlib.import_module(spec)
    except PluginError:
        raise
    except ModuleNotFoundError as e:
        if not is_path(spec) and e.name and spec.startswith(e.name):
            raise PluginError(
                f"plugin {spec}: no module named {e.name!r} (expected a .py file, a package folder or an "
                "importable module)"
            ) from e
        raise _failure(spec, e) from e
    except Exception as e:
        raise _failure(spec, e) from e
    _loaded[spec] = module
    return module


def load_entry_points() -> list[str]:
    """Import the ``raydist.plugins`` entry points of installed packages (once per process); a callable entry
    point is called with no arguments. Returns the names imported by this call."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return []
    _entry_points_loaded = True
    points = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    for point in points:
        try:
            target = point.load()
            if callable(target) and not isinstance(target, ModuleType):
                target()
        except Exception as e:
            raise _failure(f"{point.name} (entry point {point.value} of group {ENTRY_POINT_GROUP})", e) from e
    return [p.name for p in points]


def load_plugins(specs: Iterable[str] = (), *, entry_points: bool = True) -> list[ModuleType]:
    """Import every plugin of ``specs`` (and the installed entry points), once per process, in order."""
    if entry_points:
        load_entry_points()
    return [load_plugin(spec) for spec in specs]


def loaded_plugins() -> list[str]:
    """The specs imported in this process so far."""
    return list(_loaded)


def _installed(origin: str) -> bool:
    """Whether a module file lives in the installed environment -- site-packages or the standard library --
    which every node has."""
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    return any(Path(origin).resolve().is_relative_to(Path(r).resolve()) for r in roots)


def shipped_paths(specs: Sequence[str]) -> list[str]:
    """The local files and folders Ray must copy to every node for ``specs``: path plugins, and the top-level
    package of a module plugin found outside site-packages (importable here through the working directory or
    ``PYTHONPATH``, so likely nowhere else)."""
    out: list[str] = []
    for spec in specs:
        spec = resolve_spec(spec)
        if is_path(spec):
            out.append(str(_check_path(spec)))
            continue
        top = spec.partition(".")[0]
        try:
            found = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            found = None
        if found is None or not found.origin or _installed(found.origin):
            continue
        out.append(str(Path(found.origin).parent if found.submodule_search_locations else found.origin))
    return list(dict.fromkeys(out))


def plugin_runtime_env(specs: Sequence[str]) -> dict[str, list[str]]:
    """The ``runtime_env`` entries that make ``specs`` importable in every Ray process of a job
    (``{"py_modules": [...]}``; empty when nothing needs copying)."""
    paths = shipped_paths(specs)
    return {"py_modules": paths} if paths else {}
