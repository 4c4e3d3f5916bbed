"""Regenerate docs/samples/default-run.txt, the sample output of the main job shown in docs/getting-started.md:
run `raydist train` (the embedded dataset, the default preset, 2 Ray Train workers) and keep its console,
progress lines after each epoch's first one folded into "...", paths under the run's storage shown as runs/.

    python bench/default_run_sample.py                  # runs `raydist train` (minutes), writes the sample
    python bench/default_run_sample.py --from-log FILE  # formats an output captured before

tests/test_docs_sample.py checks that the sample has the lines the code prints now."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1] / "docs" / "samples" / "default-run.txt"
PROGRESS = re.compile(r"^\[raydist\] epoch \d+/\d+ step \d+/\d+ ")


def fold(lines: list[str], storage: str | None) -> list[str]:
    """The console as the sample shows it: the first progress line of the run, then "..." for the others."""
    out, folded = ["$ raydist train"], False
    for line in lines:
        if PROGRESS.match(line):
            if folded:
                continue
            folded = True
            out += [line, "..."]
            continue
        out.append(line.replace(f"{storage.rstrip('/')}/", "runs/") if storage else line)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-log", help="a captured `raydist train` console instead of a new run")
    parser.add_argument("--storage", help="the run's --storage (its prefix becomes runs/ in the sample)")
    args = parser.parse_args()
    if args.from_log:
        text, storage = Path(args.from_log).read_text(), args.storage
    else:
        storage = tempfile.mkdtemp(prefix="raydist-sample-")
        done = subprocess.run(
            ["raydist", "train", "--storage", storage], capture_output=True, text=True, check=True
        )
        text = done.stdout
    lines = [line.rstrip() for line in text.splitlines() if line.strip() or line == ""]
    SAMPLE.parent.mkdir(parents=True, exist_ok=True)
    SAMPLE.write_text("\n".join(fold(lines, storage)).rstrip() + "\n")
    print(f"wrote {SAMPLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
