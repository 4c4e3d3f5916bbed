"""The GPU check (raydist/benchmarks/gpu.py, bench/gpu_check.sh): without a CUDA device it says why, writes
the results file and exits 0 at once; its report and test-file selection are plain functions."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from raydist.benchmarks.gpu import RESULTS_FILE, Row, gpu_skip_reason, gpu_test_files, report

ROOT = Path(__file__).resolve().parents[1]


def test_check_skips_without_a_gpu(tmp_path: Path) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no device, on any machine
    start = time.perf_counter()
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert time.perf_counter() - start < 60
    assert done.stdout.startswith("gpu check skipped: ")
    reason = done.stdout.removeprefix("gpu check skipped: ").split("; wrote")[0]
    assert "NVIDIA driver" in reason or "no CUDA device" in reason
    written = (tmp_path / "out" / RESULTS_FILE).read_text()
    assert written.startswith("GPU check skipped") and reason in written


def test_skip_reason_agrees_with_torch() -> None:
    import torch

    assert (gpu_skip_reason() is None) == torch.cuda.is_available()


def test_gpu_test_files_and_report(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text("x = torch.device('cuda')\n")
    (tmp_path / "test_b.py").write_text("build_index(v, use_gpu=False)\n")
    (tmp_path / "test_c.py").write_text("gpus_total = 0  # a name, not the word\n")
    (tmp_path / "helper.py").write_text("cuda\n")
    assert [p.name for p in gpu_test_files(tmp_path)] == ["test_a.py", "test_b.py"]
    rows = [Row("faiss", "skipped", 0.2, "no GPU | build"), Row("loss", "ok", 12.3, "1.0 s")]
    text = report(rows, "head")
    assert text.splitlines()[0] == "head"
    assert "| faiss | skipped | 0 | no GPU / build |" in text and "| loss | ok | 12 | 1.0 s |" in text
