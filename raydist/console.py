"""What the user's console shows. By default: raydist's own lines (progress, tables, errors); Ray's
logs, worker chatter and library warnings go to the run's log file only. ``raydist -v`` shows everything.

The one way raydist prints, library and command line alike: :func:`say` (a line or a block of lines on stdout;
``stderr=True`` for stderr), :func:`emit` (several lines), :func:`warn` (``raydist: warning: …``), and a
:func:`status` line redrawn in place. No module of raydist calls ``print`` (tests/test_console.py)."""

from __future__ import annotations

import logging
import re
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

PREFIX = "[raydist]"  # lines the workers print for the user start with this
# Ray Train's placement-group cleaner says this every second while the State API cannot be reached, which is always
# so in a private instance started without a dashboard (raydist.runtime.start_local_ray)
STATE_API_UNREACHABLE = "Failed to query Ray Train Controller actor state"
_state = {"verbose": False}
_lock = threading.Lock()  # console writes
_file_lock = threading.Lock()  # log file appends
_ray_print: dict[str, Any] = {}  # Ray's own print_to_stdstream, before route_ray_output replaced it


def configure_console(verbose: bool) -> None:
    """Quiet (default) or verbose console, before Ray starts."""
    _state["verbose"] = verbose
    if verbose:
        return
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in (
        "ray",
        "ray.train",
        "ray.tune",
    ):  # ray.data: quiet_ray_data_console, so its session file keeps INFO
        logging.getLogger(name).setLevel(logging.WARNING)


_PERCENT = re.compile(r"^\[raydist\] epoch \d+/\d+ step \d+/\d+ \((\d+)%\)")
_bar_open = {"value": False}
BAR_WIDTH = 20


def progress_bar(line: str) -> str | None:
    """A progress line (``[raydist] epoch 2/5 step 40/117 (34%) …``) with a bar after the prefix, for a
    terminal; None for any other line."""
    match = _PERCENT.match(line)
    if not match:
        return None
    filled = min(int(match.group(1)), 100) * BAR_WIDTH // 100
    return f"{PREFIX} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {line[len(PREFIX) + 1 :]}"


def emit(lines: list[str], *, stderr: bool = False) -> None:
    """Print our lines (on stderr with ``stderr``). On a terminal, progress lines on stdout redraw one bar in
    place (the next other line starts below it); in logs, jobs and pipes every line is printed as it is."""
    if stderr:
        with _lock:
            _end_bar()
            sys.stderr.write("".join(line + "\n" for line in lines))
            sys.stderr.flush()
        return
    out = sys.stdout
    tty = out.isatty()
    with _lock:
        for line in lines:
            bar = progress_bar(line) if tty else None
            if bar is not None:
                out.write("\r\033[K" + bar)
                _bar_open["value"] = True
                continue
            if _bar_open["value"]:
                out.write("\n")
                _bar_open["value"] = False
            out.write(line + "\n")
        out.flush()


def status(line: str) -> None:
    """A live status line: on a terminal redrawn in place (the next other line starts below it), elsewhere
    printed as a line."""
    out = sys.stdout
    with _lock:
        if out.isatty():
            out.write("\r\033[K" + line)
            _bar_open["value"] = True
        else:
            out.write(line + "\n")
        out.flush()


def quiet_ray_logger_console(level: int = logging.ERROR) -> None:
    """Without ``-v``: Ray's own console handler (on the ``ray`` logger) shows only records of ``level`` and
    above; the run's log file (:func:`route_ray_output`) still gets every record."""
    if is_verbose():
        return
    for handler in logging.getLogger("ray").handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.setLevel(level)


def say(*parts: Any, stderr: bool = False) -> None:
    """Print a line once, its parts joined by spaces as ``print`` joins them (on stderr with ``stderr``).
    (Train V2 patches ``print`` in workers to also copy each line to its logger, which prints every line twice
    on the driver; writing to the stream does not.) In-process, a terminal shows progress lines as a bar redrawn
    in place (:func:`emit`)."""
    emit([" ".join(str(p) for p in parts)], stderr=stderr)


def _end_bar() -> None:
    """End a progress bar open on stdout, so that the next line gets a line of its own (hold ``_lock``)."""
    if _bar_open["value"]:
        sys.stdout.write("\n")
        sys.stdout.flush()
        _bar_open["value"] = False


def warn(*parts: Any) -> None:
    """One warning line on stderr, ``raydist: warning: …`` (as errors read ``raydist: error: …``); shown in
    the quiet console too. A progress bar open on stdout is ended first, so the warning gets its own line."""
    say("raydist: warning:", *parts, stderr=True)


def is_verbose() -> bool:
    """Whether ``-v`` was given."""
    return _state["verbose"]


def quiet_ray_data_console() -> None:
    """Ray Data sets up its own logger when ``ray.data`` is first imported, with a console handler at INFO
    (planning lines such as the parquet reader's estimates, printed by the driver); without ``-v`` lower that
    handler to WARNING. Its session file (``logs/ray-data/ray-data.log``) keeps everything. Imports ray.data."""
    import ray.data  # noqa: F401  (configures ray.data's logging on first import)

    if is_verbose():
        return
    for handler in logging.getLogger("ray.data").handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.setLevel(logging.WARNING)


def route_ray_output(log_file: str | Path, *, show_ours: bool = True) -> None:
    """Send every line that Ray forwards from workers and actors, and the raylet's warnings, to ``log_file``; on
    the console keep only lines starting with ``[raydist]`` (none with ``show_ours=False``: a sweep, whose
    driver prints one line per trial event; everything with ``-v``). Call after Ray is initialised; a later
    call moves the output to its own file. Lines of :data:`STATE_API_UNREACHABLE` are dropped."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    from ray._private.worker import print_to_stdstream

    path = Path(log_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    verbose = is_verbose()
    ray_print = _ray_print.setdefault("original", print_to_stdstream)

    def handle(data: dict[str, Any]) -> None:
        lines = [line for line in data.get("lines", []) if STATE_API_UNREACHABLE not in line]
        if not lines:
            return
        data = {**data, "lines": lines}
        source = data.get("actor_name") or data.get("task_name") or f"pid={data.get('pid')}"
        with _file_lock, open(path, "a") as f:
            f.writelines(f"({source}) {line}\n" for line in lines)
        if verbose:
            ray_print(data, ignore_prefix=False)
            return
        ours = [line for line in data.get("lines", []) if show_ours and line.startswith(PREFIX)]
        if ours:
            emit(ours)

    dispatcher.remove_handler("ray_print_logs")
    dispatcher.remove_handler("raydist")
    dispatcher.add_handler("raydist", handle)
    _route_raylet_messages(handle, ray_print)
    root = logging.getLogger("ray")
    if not any(getattr(h, "baseFilename", None) == str(path.resolve()) for h in root.handlers):
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)


def _route_raylet_messages(handle: Any, ray_print: Any) -> None:
    """The raylet's warnings (too many worker processes, memory pressure ...) reach the driver on another path
    than worker output: ``ray._private.worker.listen_error_messages`` prints them with the module's
    ``print_to_stdstream`` (source ``pid=raylet``). Send those to ``handle`` too; others print as before."""
    import ray._private.worker as ray_worker

    def print_or_route(data: dict[str, Any], **kwargs: Any) -> None:
        if data.get("pid") == "raylet":
            handle(data)
        else:
            ray_print(data, **kwargs)

    ray_worker.print_to_stdstream = print_or_route
