"""raydist.console: a terminal shows progress lines as one bar redrawn in place; logs and pipes get every line
unchanged; console is the one way raydist prints."""

import ast
import io
from pathlib import Path

import pytest

from raydist import console

PROGRESS = [
    "[raydist] epoch 1/5 step 20/117 (17%) samples/s 1234 ETA 3m05s loss 12.3",
    "[raydist] epoch 1/5 step 40/117 (34%) samples/s 1250 ETA 2m50s loss 11.0",
]
EPOCH = "[raydist] epoch 1 SH loss 10.9 val rsum 320.1"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_pipe_gets_every_line_unchanged(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    console.emit([*PROGRESS, EPOCH])
    assert out.getvalue() == "\n".join([*PROGRESS, EPOCH]) + "\n"


def test_a_terminal_redraws_one_bar_then_starts_the_next_line_below(monkeypatch):
    out = Terminal()
    monkeypatch.setattr("sys.stdout", out)
    console.emit(PROGRESS[:1])
    console.emit(PROGRESS[1:])
    console.emit([EPOCH])
    text = out.getvalue()
    first, second = text.split("\r\033[K")[1:]
    assert first == "[raydist] [###.................] " + PROGRESS[0][len("[raydist] ") :]  # 17% of 20 = 3
    assert second.startswith("[raydist] [######..............] epoch 1/5 step 40/117")  # 34% → 6
    assert second.endswith("loss 11.0\n" + EPOCH + "\n")  # the bar line is closed before the epoch line
    assert text.count("\n") == 2


@pytest.mark.parametrize(
    "line", [EPOCH, "[raydist] schedule: 5 epochs × 117 steps", "epoch 1/5 step 2/3 (66%)"]
)
def test_only_progress_lines_get_a_bar(line):
    assert console.progress_bar(line) is None


def test_warn_writes_one_prefixed_line_to_stderr_after_closing_a_bar(monkeypatch):
    out, err = Terminal(), io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    console.emit(PROGRESS[:1])
    console.warn("data.npz:", "scales differ")
    assert err.getvalue() == "raydist: warning: data.npz: scales differ\n"
    assert out.getvalue().endswith("\n") and "scales differ" not in out.getvalue()


class _OneRayletMessage:
    """The parts of a Ray driver worker that ``listen_error_messages`` reads: its error subscription yields one
    raylet message, then the listener is told to stop."""

    def __init__(self, message: str, stop) -> None:
        self.message, self.stop = message, stop
        self.current_job_id = type("JobId", (), {"binary": lambda self: b"job"})()
        self.gcs_error_subscriber = self

    def subscribe(self) -> None:
        pass

    def poll(self):
        self.stop.set()
        return None, {"job_id": None, "error_message": self.message}


@pytest.mark.parametrize("verbose", [False, True])
def test_raylet_warnings_go_to_the_log_file_and_only_with_v_to_the_console(
    verbose, monkeypatch, tmp_path, capsys
):
    import threading

    import ray._private.worker as ray_worker
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    # Ray's own printer (an earlier in-process run may have routed it), restored afterwards
    monkeypatch.setattr(
        ray_worker, "print_to_stdstream", console._ray_print.get("original", ray_worker.print_to_stdstream)
    )
    monkeypatch.setattr(console, "_ray_print", {})
    monkeypatch.setattr(dispatcher, "handlers", list(dispatcher.handlers))
    monkeypatch.setitem(console._state, "verbose", verbose)
    # Ray drops a line like one it printed recently (numbers aside): each case words its own.
    warning = (
        f"WARNING: 9 PYTHON worker processes have been started ({'verbose' if verbose else 'quiet'} console)"
    )
    stop = threading.Event()
    ray_worker.listen_error_messages(_OneRayletMessage(warning, stop), stop)
    assert warning in capsys.readouterr().out  # Ray itself prints it on the console

    console.route_ray_output(tmp_path / "raydist.log")
    console.route_ray_output(tmp_path / "raydist.log")  # a second sweep re-routes: still one copy per line
    later = warning.replace("have been", "were")
    stop = threading.Event()
    ray_worker.listen_error_messages(_OneRayletMessage(later, stop), stop)
    shown = capsys.readouterr()
    assert (later in shown.out + shown.err) == verbose
    assert (tmp_path / "raydist.log").read_text() == f"(pid=raylet) {later}\n"


def test_the_cleaners_state_api_warning_is_left_out_of_the_log(monkeypatch, tmp_path, capsys):
    """A private instance without a dashboard has no State API: Ray Train's placement-group cleaner says so every
    second, and those lines reach neither the run's log nor the console; every other line is routed as before."""
    import ray._private.worker as ray_worker
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    monkeypatch.setattr(
        ray_worker, "print_to_stdstream", console._ray_print.get("original", ray_worker.print_to_stdstream)
    )
    monkeypatch.setattr(console, "_ray_print", {})
    monkeypatch.setattr(dispatcher, "handlers", list(dispatcher.handlers))
    monkeypatch.setitem(console._state, "verbose", False)
    console.route_ray_output(tmp_path / "raydist.log")
    # the cleaner's words in Ray 2.60 (ray/train/v2/_internal/execution/controller/placement_group_cleaner.py)
    noise = (
        "Failed to query Ray Train Controller actor state. State API may be temporarily unavailable. "
        "Continuing to monitor."
    )
    dispatcher.emit({"actor_name": "PlacementGroupCleaner", "pid": 1, "lines": [noise, noise]})
    dispatcher.emit(
        {"actor_name": "RayTrainWorker", "pid": 2, "lines": [noise, "[raydist] epoch 1/1 done", "other"]}
    )
    logged = (tmp_path / "raydist.log").read_text()
    assert logged == "(RayTrainWorker) [raydist] epoch 1/1 done\n(RayTrainWorker) other\n"
    assert capsys.readouterr().out == "[raydist] epoch 1/1 done\n"


def test_a_sweeps_console_gets_no_trial_progress_only_its_log_does(monkeypatch, tmp_path, capsys):
    """A sweep routes with show_ours=False: the trials' own [raydist] lines (per-step progress of every trial)
    go to the sweep's raydist.log only; the driver prints one line per trial event itself."""
    import ray._private.worker as ray_worker
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    monkeypatch.setattr(
        ray_worker, "print_to_stdstream", console._ray_print.get("original", ray_worker.print_to_stdstream)
    )
    monkeypatch.setattr(console, "_ray_print", {})
    monkeypatch.setattr(dispatcher, "handlers", list(dispatcher.handlers))
    monkeypatch.setitem(console._state, "verbose", False)
    console.route_ray_output(tmp_path / "raydist.log", show_ours=False)
    progress = [
        "[raydist] epoch 1/3 step 5/64 (8%) samples/s 900 ETA 10s loss 0.4",
        "[raydist] epoch 1/3 done",
    ]
    dispatcher.emit({"actor_name": "ImplicitFunc", "pid": 3, "lines": progress})
    assert (tmp_path / "raydist.log").read_text() == "".join(f"(ImplicitFunc) {line}\n" for line in progress)
    assert capsys.readouterr().out == ""


def test_the_sweep_status_line_counts_trials_and_names_the_best():
    from types import SimpleNamespace

    from raydist.tune.space import parse_space
    from raydist.tune.sweep import TrialLines

    space = parse_space({"metric": "val/rsum", "space": {"loss.margin": {"choice": [0.1, 0.2]}}}, name="m")
    lines = TrialLines(space)
    trials = [
        SimpleNamespace(trial_id=str(k), status=s) for k, s in enumerate(["RUNNING", "TERMINATED", "PENDING"])
    ]
    lines.result(trials[0], {"val/rsum": 120.5})
    lines.result(trials[1], {"val/rsum": 130.25})
    lines.result(trials[1], {"val/rsum": 99.0})  # a later, worse epoch: the trial's best stays
    line = lines.summary(trials)
    assert "1 running, 1 done, 0 failed, 1 pending; best val/rsum 130.2 (trial_1)" in line


@pytest.mark.parametrize("verbose", [False, True])
def test_ray_datas_planning_lines_stay_off_the_console_without_v(verbose, monkeypatch):
    """Ray Data's own console handler (INFO, set up when ray.data is imported: the driver printed the parquet
    reader's estimates on every streamed run) is lowered to WARNING; its session file handler keeps INFO; -v
    leaves it as Ray Data set it."""
    import logging

    import ray.data  # noqa: F401  (Ray Data configures its logger on first import, before the CLI's own set-up)

    logger = logging.getLogger("ray.data")
    streams = [
        h
        for h in logger.handlers
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]
    saved = [h.level for h in streams]
    names = ("ray", "ray.train", "ray.tune", "ray.data")
    levels = {name: logging.getLogger(name).level for name in names}
    monkeypatch.setitem(console._state, "verbose", verbose)  # restored after the test
    try:
        for h in streams:
            h.setLevel(logging.INFO)  # as Ray Data configures it
        logger.setLevel(logging.DEBUG)
        console.configure_console(
            verbose
        )  # as the CLI does first (it must not undo what Ray Data's file gets)
        console.quiet_ray_data_console()
        streams = [
            h
            for h in logger.handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
        ]
        others = [h for h in logger.handlers if h not in streams]
        assert streams and others  # Ray Data's console handler and its session file handler
        assert all(h.level == (logging.INFO if verbose else logging.WARNING) for h in streams)
        assert all(h.level <= logging.INFO for h in others) and logger.isEnabledFor(logging.INFO)
    finally:
        for h, level in zip(streams, saved, strict=False):
            h.setLevel(level)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def test_no_module_of_raydist_calls_print():
    """The one way raydist prints is :mod:`raydist.console` (``say``, ``emit``, ``warn``, ``status``), in the
    library and the command line alike: no ``print(...)`` call anywhere in the package."""
    package = Path(console.__file__).parent
    calls = [
        f"{path.relative_to(package.parent)}:{node.lineno}"
        for path in sorted(package.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
    ]
    assert calls == []


def test_say_joins_its_parts_as_print_does_and_stderr_ends_an_open_bar(monkeypatch):
    out, err = Terminal(), io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    console.say("wrote", 3, "rows")
    console.emit(PROGRESS[:1])
    console.say("raydist: error: boom", stderr=True)
    assert out.getvalue().startswith("wrote 3 rows\n") and out.getvalue().endswith("\n")
    assert err.getvalue() == "raydist: error: boom\n"
