"""What the README's tour and the docs' commands write into a checkout is ignored by git (issue #51): every
relative ``--out`` / ``--storage`` / ``--record`` of a ``raydist`` command in a ```bash block, the runs folder
the run commands default to, ``raydist tokenizer``'s default file and ``mkdocs build``'s site, each checked
with ``git check-ignore`` against the checkout's own .gitignore."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
WRITES = ("--out", "--storage", "--record")
RUN_COMMANDS = {"train", "tune", "experiment"}  # without --storage: ./runs
DEFAULT_WRITES = {
    "runs/x",
    "tokenizer.json",
    "site/index.html",
}  # runs, `raydist tokenizer train`, mkdocs build


def written_paths(text: str) -> set[str]:
    """The relative paths the ``raydist`` commands of a Markdown text's bash blocks write (placeholders such as
    ``DIR`` or ``$OUT``, absolute paths and URIs left out)."""
    paths = set()
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            for segment in re.split(r"&&|;|\|", line.split(" #")[0]):
                try:
                    words = shlex.split(segment)
                except ValueError:
                    continue
                if words[:1] != ["raydist"]:
                    continue
                for option, value in zip(words, words[1:], strict=False):
                    if option in WRITES and re.fullmatch(r"[a-z0-9][\w.-]*(/[\w.-]*)*", value):
                        paths.add(value)
                if words[1:2] and words[1] in RUN_COMMANDS and "--storage" not in words:
                    paths.add("runs/x")
    return paths


def test_the_parser_finds_what_a_block_writes():
    text = (
        "```bash\nraydist make-data synthetic --out data/syn --seed 0   # a comment --out no\n"
        "raydist train --data data/syn --storage runs && raydist index --checkpoint runs/t --out indexes/t\n"
        "raydist eval --checkpoint RUN --out DIR; raydist train --data X\n"
        "raydist convert npz --src a.npz \\\n    --out /tmp/abs --record s3://b/x\n```\n"
    )
    assert written_paths(text) == {"data/syn", "runs", "indexes/t", "runs/x"}


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_what_the_tour_and_the_docs_write_is_ignored():
    paths = set(DEFAULT_WRITES)
    for doc in DOC_FILES:
        paths |= written_paths(doc.read_text(encoding="utf-8"))
    assert {"data/syn", "indexes/tour", "runs"} <= paths  # the README's tour
    # a folder as a file inside it (a pattern ending in / matches folders only, and these do not exist here)
    files = sorted(p if Path(p).suffix else f"{p.rstrip('/')}/x" for p in paths)
    answer = subprocess.run(
        ["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    kept = [line.split("\t")[1] for line in answer.stdout.splitlines() if line.startswith("::")]
    assert not kept, f"not in .gitignore: {kept}"
