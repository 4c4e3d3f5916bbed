"""The sample output of the main job in docs/getting-started.md (docs/samples/default-run.txt, written by
bench/default_run_sample.py from a real `raydist train`) must have the lines the code prints now, and the README's
default-run figure must be the sample's: a run in this process prints the same kinds of lines (Ray's own two
aside), so a line added, renamed or dropped since the sample was made fails here."""

from __future__ import annotations

import re
from pathlib import Path

from raydist.cli import main
from raydist.data import make_synthetic

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "docs" / "samples" / "default-run.txt"
PROGRESS = re.compile(r"^\[raydist\] epoch \d+/\d+ step ")
RAY_ONLY = {
    "[raydist] starting a local Ray instance …",
    "[raydist] Ray ready in N s; starting N Ray Train workers …",
}


def kinds(text: str) -> set[str]:
    """What each line is, numbers and values aside: ``[raydist] schedule``, ``== per-epoch metrics ==``,
    ``run folder``; table rows and progress lines are left out."""
    out = set()
    for line in text.splitlines():
        if not line.strip() or line[0] in " 0123456789$." or PROGRESS.match(line):
            continue
        if line.startswith(("epoch   step", "i2t", "t2i", "rsum")):  # table headers and rows
            continue
        line = re.sub(r"\d+(\.\d+)?", "N", line)
        out.add(line if line.startswith("==") else line.split(":")[0])
    return out


def test_the_sample_of_the_main_run_has_the_lines_the_code_prints(tmp_path, capsys):
    data = make_synthetic(tmp_path / "data", images=100, captions_per_image=5, dim=32, seed=0)
    argv = ["train", "--data", str(data), "--preset", "tiny", "--storage", str(tmp_path / "runs")]
    assert main([*argv, "train.num_workers=0", "train.epochs=2"]) == 0
    now = kinds(capsys.readouterr().out)
    sample = kinds(SAMPLE.read_text())
    assert sample >= RAY_ONLY
    assert sample - RAY_ONLY == now, {"only in the sample": sample - RAY_ONLY - now, "only now": now - sample}


def test_the_readme_quotes_the_samples_test_rsum():
    (rsum,) = re.findall(r"^rsum\s+([\d.]+)$", SAMPLE.read_text(), re.MULTILINE)
    assert f"test rsum **{rsum}**" in (ROOT / "README.md").read_text()
    assert f"**test rsum {rsum}**" in (ROOT / "docs" / "getting-started.md").read_text()
