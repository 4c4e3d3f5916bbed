"""raydist.benchmarks: every benchmark of the catalog runs in smoke mode (no timing asserted), the catalog,
the results file, and the dense reference formulation of the loss benchmark."""

from __future__ import annotations

import platform

import pytest
import torch

from raydist.benchmarks import (
    BENCHMARKS,
    Benchmark,
    append_results,
    benchmark_name,
    benchmark_names,
    recorded_command,
    register_benchmark,
    run_benchmarks,
)
from raydist.benchmarks.loss import dense_max_of_hinges
from raydist.losses import l2_normalize, ranking_loss

NAMES = [
    "loss",
    "loss-memory",
    "data",
    "step",
    "gather",
    "gradclust",
    "startup",
    "retrieval",
    "real-cross-view",
    "text-encoders",
    "tokenize",
    "images",
    "pixels-vs-vectors",
    "grad-cache",
    "serve",
    "webdataset",
    "index",
]
NEEDS_SKLEARN = {
    "real-cross-view",
    "pixels-vs-vectors",
}  # the experiments extra (pixels-vs-vectors: its default data)


# the benchmarks that run on Ray (data, step, …, pixels-vs-vectors without --in-process) or spawn two gloo processes
# (gather, gradclust), even in smoke mode; grad-cache measures each cell in a fresh process (4 in smoke mode)
SLOW = {
    "data",
    "step",
    "gather",
    "gradclust",
    "tokenize",
    "images",
    "pixels-vs-vectors",
    "serve",
    "grad-cache",
    "webdataset",
    "index",
}


GLOO = {
    "gather",
    "gradclust",
    "grad-cache",
}  # of SLOW, those that start no Ray (gloo processes, fresh processes)


def _marks(name: str) -> list[pytest.MarkDecorator]:
    return [pytest.mark.slow, *([pytest.mark.gloo] if name in GLOO else [])] if name in SLOW else []


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in NAMES])
def test_benchmark_runs_in_smoke_mode(
    name: str, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    if name in NEEDS_SKLEARN:
        pytest.importorskip("sklearn")
    if BENCHMARKS.get(name).ray:  # the session's Ray instance (conftest), not a private one per benchmark
        request.getfixturevalue("ray_cluster")
    table = run_benchmarks([name], smoke=True, repeats=3)
    assert table.startswith(f"### {name} (smoke)")
    assert "|---" in table and table.strip().splitlines()[-1].startswith("| ")
    assert table.strip() in capsys.readouterr().out


def test_the_catalog_names_every_benchmark_once_with_its_docstring() -> None:
    assert benchmark_names() == NAMES  # registered by their modules, found with pkgutil, in their order
    for entry in BENCHMARKS.entries():
        benchmark = entry.obj
        assert (
            benchmark.name == entry.name
            and benchmark.summary == benchmark.run.__doc__.strip().splitlines()[0]
        )
        assert entry.module == benchmark.run.__module__ and entry.module.startswith("raydist.benchmarks.")
    ray = {n for n in NAMES if BENCHMARKS.get(n).ray}
    assert ray == {"data", "step", "tokenize", "images", "pixels-vs-vectors", "serve", "webdataset", "index"}


def test_a_new_benchmark_registers_itself_and_runs_last() -> None:
    """A module of the package (here a plugin's) registers with the decorator; no order: after the shipped
    ones."""

    @register_benchmark("toy-last")
    def toy(*, smoke: bool, repeats: int) -> str:
        """A toy."""
        return "| a |\n|---|\n| 1 |"

    try:
        assert benchmark_names() == [*NAMES, "toy-last"]
        assert BENCHMARKS.module_of("toy-last") == __name__
        with pytest.raises(ValueError, match="already registered"):
            register_benchmark("loss")(toy)
    finally:
        BENCHMARKS.unregister("toy-last")


def test_a_former_name_selects_its_benchmark() -> None:
    """``gc`` (gradient clustering's benchmark before it was named ``gradclust``) still runs it."""
    assert benchmark_name("gc") == benchmark_name("gradclust") == "gradclust"
    assert benchmark_name("no-such-benchmark") == "no-such-benchmark"
    BENCHMARKS.register("toy", Benchmark("toy", lambda **_: "| a |\n|---|\n| 1 |", aliases=("old-toy",)))
    try:
        assert run_benchmarks(["old-toy"], smoke=True, repeats=1).startswith("### toy (smoke)")
    finally:
        BENCHMARKS.unregister("toy")


def test_run_benchmarks_runs_a_catalog_entry() -> None:
    calls = []

    def toy(*, smoke: bool, repeats: int) -> str:
        """A toy benchmark.

        More text."""
        calls.append((smoke, repeats))
        return "| a |\n|---|\n| 1 |"

    BENCHMARKS.register("toy", Benchmark("toy", toy), module=__name__)
    try:
        assert "### toy (4 repeats): A toy benchmark.\n" in run_benchmarks(["toy"], smoke=False, repeats=4)
        run_benchmarks(["toy"], smoke=True, repeats=4)
        assert calls == [(False, 4), (True, 1)]
        with pytest.raises(ValueError, match="unknown benchmark"):
            run_benchmarks(["no-such-benchmark"], smoke=True, repeats=1)
        with pytest.raises(ValueError, match="repeats=0"):
            run_benchmarks(["toy"], smoke=False, repeats=0)
    finally:
        BENCHMARKS.unregister("toy")


def test_recorded_command_names_the_thread_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert recorded_command(["raydist", "bench", "loss", "--record", "a b.md"]) == (
        "OMP_WAIT_POLICY=PASSIVE raydist bench loss --record 'a b.md'"
    )


def test_append_results_keeps_the_file_and_records_the_run(tmp_path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Earlier section\n")
    append_results(results, "raydist bench loss --repeats 2", "| x |\n|---|\n| 1 |")
    text = results.read_text()
    assert text.startswith("# Benchmark results\n\n## Earlier section\n\n## Benchmark suite")
    assert "    raydist bench loss --repeats 2" in text
    for version in (f"torch {torch.__version__}", "ray ", f"python {platform.python_version()}", "cores"):
        assert version in text
    assert text.endswith("| x |\n|---|\n| 1 |\n")


def test_dense_reference_is_max_of_hinges() -> None:
    """The benchmark's mask-and-clamp formulation equals ``ranking_loss`` MH (value and gradients)."""
    g = torch.Generator().manual_seed(0)
    img, cap = (
        l2_normalize(torch.randn(9, 4, generator=g, dtype=torch.float64)).requires_grad_() for _ in "ic"
    )
    got, want = dense_max_of_hinges(img, cap, 0.3), ranking_loss(img, cap, margin=0.3, hardest=True)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for a, b in zip(
        torch.autograd.grad(got, (img, cap)), torch.autograd.grad(want, (img, cap)), strict=False
    ):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("epochs", [5, 6, 7, 8])
def test_the_images_steady_rate_covers_whole_pairs_of_slow_and_fast_epochs(epochs: int) -> None:
    """The stream's epochs alternate (one streams while the next pass is read ahead, the next is mostly read
    already): a steady pipeline of 200 images/s delivers 100-image epochs in 0.8 s and 0.2 s by turns (the
    warm-up epochs are slower). Its steady rate is 200 whatever the number of epochs; an odd count of the
    alternating epochs would give 100 · 3 / 1.8 = 167 (or 300 / 1.2 = 250)."""
    from raydist.benchmarks.images import WARMUP_EPOCHS, EpochClock

    clock = EpochClock()
    clock.images = [100] * epochs
    clock.seconds = [5.0, 0.5] + [0.8 if e % 2 == 0 else 0.2 for e in range(WARMUP_EPOCHS, epochs)]
    assert clock.steady == pytest.approx(200.0)
    images, _ = clock.steady_images_seconds()
    assert images == 100 * 2 * ((epochs - WARMUP_EPOCHS) // 2)


def test_the_step_benchmarks_quick_mode_takes_turns_window_by_window(tmp_path) -> None:
    """``raydist bench step`` (quick): after the warm-up steps, the Ray run and its reference (here two threads)
    run their windows in turns, Ray first in even pairs and the reference first in odd ones, never at once; each
    window's rate leaves out its first step (after the wait)."""
    import threading

    from raydist.benchmarks.step import Aborted, WindowClock, Windows, take_turns, window_stats

    windows = Windows(str(tmp_path), warm=2, steps=3, count=3)
    starts_at = {s: windows.boundary(s) for s in range(windows.total) if windows.boundary(s) is not None}
    assert starts_at == {1: 0, 4: 1, 7: 2, 10: 3}  # after the warm-up, each window, the end
    log: list[tuple[str, int]] = []

    def side(name: str) -> None:
        clock = WindowClock(windows, name)
        for step in range(windows.total):
            log.append((name, step))
            clock.at_step_end(step, rank=0)

    threads = [threading.Thread(target=side, args=(name,)) for name in ("ray", "ref")]
    for thread in threads:
        thread.start()
    take_turns(windows)
    for thread in threads:
        thread.join(timeout=30)
    measured = [(name, step) for name, step in log if step >= windows.warm]
    order = ["ray", "ref", "ref", "ray", "ray", "ref"]
    starts = [windows.span(k).start for k in range(windows.count) for _ in range(2)]
    assert measured == [
        (name, start + i) for name, start in zip(order, starts, strict=True) for i in range(3)
    ]

    times = [0.0, 1.0] + [10.0 * k + 0.5 * i for k in range(3) for i in range(3)]  # 2 steps/s in every window
    rates, faults = window_stats({"times": times, "faults": list(range(11))}, windows)
    assert rates == [2.0, 2.0, 2.0] and faults == [1.0, 1.0, 1.0]

    other = Windows(str(tmp_path / "other"), warm=1, steps=3, count=1)  # its gates: never opened
    (tmp_path / "other").mkdir()
    other.abort()
    with pytest.raises(Aborted):
        WindowClock(other, "ray").at_step_end(other.warm + other.steps - 1, rank=1)
