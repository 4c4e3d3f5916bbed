"""raydist.benchmarks: every registered benchmark runs in smoke mode (no timing asserted), the registry,
the results file, and the dense reference formulation of the loss benchmark."""

from __future__ import annotations

import platform

import pytest
import torch

from raydist.benchmarks import (
    append_results,
    register_benchmark,
    registered_benchmarks,
    registry,
    run_benchmarks,
)
from raydist.benchmarks.harness import RAY_BENCHMARKS
from raydist.benchmarks.loss import dense_max_of_hinges
from raydist.losses import l2_normalize, ranking_loss


@pytest.mark.parametrize("name", list(registered_benchmarks()))
def test_benchmark_runs_in_smoke_mode(
    name: str, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    if name in RAY_BENCHMARKS:  # the session's Ray instance (conftest), not a private one per benchmark
        request.getfixturevalue("ray_cluster")
    table = run_benchmarks([name], smoke=True, repeats=3)
    assert table.startswith(f"### {name} (smoke)")
    assert "|---" in table and table.strip().splitlines()[-1].startswith("| ")
    assert table.strip() in capsys.readouterr().out


def test_registry_takes_one_decorated_function(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "BENCHMARKS", dict(registry.BENCHMARKS))
    calls = []

    @register_benchmark("toy")
    def toy(*, smoke: bool, repeats: int) -> str:
        """A toy benchmark."""
        calls.append((smoke, repeats))
        return "| a |\n|---|\n| 1 |"

    assert "toy" in registered_benchmarks() and registered_benchmarks()["toy"].summary == "A toy benchmark."
    assert "### toy (4 repeats): A toy benchmark." in run_benchmarks(["toy"], smoke=False, repeats=4)
    run_benchmarks(["toy"], smoke=True, repeats=4)
    assert calls == [(False, 4), (True, 1)]
    with pytest.raises(ValueError, match="already registered"):
        register_benchmark("toy")(toy)
    with pytest.raises(ValueError, match="unknown benchmark"):
        run_benchmarks(["no-such-benchmark"], smoke=True, repeats=1)


def test_append_results_keeps_the_file_and_records_the_run(tmp_path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Earlier section\n")
    append_results(results, "python bench/bench_loss.py --repeats 2", "| x |\n|---|\n| 1 |")
    text = results.read_text()
    assert text.startswith("# Benchmark results\n\n## Earlier section\n\n## Benchmark suite")
    assert "    python bench/bench_loss.py --repeats 2" in text
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
    for a, b in zip(torch.autograd.grad(got, (img, cap)), torch.autograd.grad(want, (img, cap))):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
