"""The commands shown in the README and the docs are real: the blocks marked runnable run, and every `raydist`
command in a bash block parses with the real argument parser.

Convention (docs/development.md, "Runnable docs"): a ```bash block preceded by the line `<!-- runnable -->`
is run by :func:`test_runnable_blocks_run`: a file's runnable blocks in order, in one fresh temporary folder,
with `bash -euo pipefail`, `raydist` and `python` being this interpreter's. Such blocks must be fast as
written and start no Ray (this test is not marked slow): :func:`ray_free_problems` refuses the obvious ways
to start it. :func:`test_bash_commands_parse` reads every ```bash block, runnable or not, and parses each
`raydist ...` command (also `python jobs/X.py ...`, `python -m raydist.jobs.X ...`, and the command after
`--` of `ray job submit`, `python -m raydist.simcluster` and `python -m raydist.autoscaling`) with
:func:`raydist.cli.parse_args`, without running it: an unknown sub-command, choice or option fails, and so
does an unknown `key=value` config key, an unknown benchmark or experiment name, a missing space file or
script."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = "<!-- runnable -->"
BLOCK_TIMEOUT_S = 240  # one block on a loaded 2-core box; the whole test takes well under a minute when quiet
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CONFIG_COMMANDS = {"train", "tune", "experiment"}  # the sub-commands that take key=value config overrides
JOB_MODULES = {
    "train": "train",
    "eval": "eval",
    "tune": "tune",
    "make_data": "make-data",
    "validate": "validate",
}
RUNS_A_COMMAND = {"raydist.simcluster", "raydist.autoscaling"}  # `python -m MODULE ... -- <raydist command>`


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    text: str
    runnable: bool

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def bash_blocks(path: Path) -> list[Block]:
    """The ```bash blocks of a Markdown file, each marked runnable when the line before its fence is the marker."""
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = lines[i].strip()
        if fence.startswith("```") and fence[3:].strip().split(" ")[0] == "bash":
            start = i
            i += 1
            body: list[str] = []
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            runnable = start > 0 and lines[start - 1].strip() == RUNNABLE
            blocks.append(Block(path, start + 1, "\n".join(body) + "\n", runnable))
        elif fence.startswith("```"):  # another language's block: skip to its end
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                i += 1
        i += 1
    return blocks


ALL_BLOCKS = [b for path in DOC_FILES for b in bash_blocks(path)]
RUNNABLE_FILES = sorted({b.path for b in ALL_BLOCKS if b.runnable})


def command_lines(text: str) -> list[str]:
    """The block's shell lines with backslash continuations joined (and a quote left open on one line closed on
    the lines after it), comment-only lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    lines: list[str] = []
    pending = ""
    for line in joined.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending = f"{pending}\n{line}" if pending else line
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # No closing quotation: the command goes on
            continue
        lines.append(pending)
        pending = ""
    return [*lines, pending] if pending else lines


def segments(line: str, variables: dict[str, str]) -> list[list[str]]:
    """The simple commands of one shell line (split at ``&& || ; |``, comments dropped), ``$NAME`` of a variable
    set earlier in the block expanded into its words, and ``NAME=value`` assignments recorded in ``variables``."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words = list(lexer)
    out: list[list[str]] = []
    current: list[str] = []
    for word in [*words, ";"]:
        if word and set(word) <= set(";&|"):
            if current:
                out.append(current)
            current = []
        elif word.startswith("$") and word[1:] in variables:
            current.extend(shlex.split(variables[word[1:]]))
        else:
            current.append(word)
    for seg in out:
        if len(seg) == 1 and re.fullmatch(r"[A-Za-z_]\w*=.*", seg[0]):
            name, value = seg[0].split("=", 1)
            variables[name] = value
    return out


def raydist_argvs(seg: list[str]) -> list[tuple[str, list[str]]]:
    """The raydist commands in one simple command, each as (how it was written, argv after ``raydist``)."""
    while seg and (seg[0] in ("export", "env", "time", "exec") or re.fullmatch(r"[A-Za-z_]\w*=.*", seg[0])):
        seg = seg[1:]
    if not seg:
        return []
    head = seg[0]
    if head == "raydist":
        return [("raydist", seg[1:])]
    if head in ("python", "python3"):
        if len(seg) > 2 and seg[1] == "-m":
            module = seg[2]
            if module.startswith("raydist.jobs."):
                name = module.rsplit(".", 1)[1]
                return [(f"python -m {module}", [JOB_MODULES.get(name, name), *seg[3:]])]
            if module in RUNS_A_COMMAND and "--" in seg:
                return [(f"python -m {module}", [f"<module {module}>"])] + [
                    (f"python -m {module} -- raydist", seg[seg.index("--") + 1 :])
                ]
            if module.startswith("raydist"):
                return [(f"python -m {module}", [f"<module {module}>"])]
            return []
        if len(seg) > 1 and re.fullmatch(r"jobs/\w+\.py", seg[1]):
            name = Path(seg[1]).stem
            return [
                (f"python {seg[1]}", [f"<script {seg[1]}>"]),
                (f"python {seg[1]}", [JOB_MODULES.get(name, name), *seg[2:]]),
            ]
        if len(seg) > 1 and seg[1].endswith(".py") and "/" in seg[1]:
            return [(f"python {seg[1]}", [f"<script {seg[1]}>"])]
        return []
    if head == "bash" and len(seg) > 1 and seg[1].endswith(".sh"):
        return [(f"bash {seg[1]}", [f"<script {seg[1]}>"])]
    if head == "ray" and "--" in seg:  # ray job submit ... -- python jobs/train.py ...
        return raydist_argvs(seg[seg.index("--") + 1 :])
    return []


def is_placeholder(word: str) -> bool:
    return word.isupper() or "…" in word or "..." in word


def check_argv(argv: list[str]) -> str | None:
    """Why ``raydist *argv`` is not a valid command, or None."""
    from raydist.benchmarks import benchmark_name, benchmark_names
    from raydist.cli import parse_args
    from raydist.config import valid_keys
    from raydist.experiments.catalog import EXPERIMENTS
    from raydist.tune.space import space_names

    if argv and argv[0].startswith("<module "):
        module = argv[0][len("<module ") : -1]
        return None if importlib.util.find_spec(module) else f"no module {module}"
    if argv and argv[0].startswith("<script "):
        script = argv[0][len("<script ") : -1]
        return (
            None
            if is_placeholder(script) or (ROOT / script).is_file()
            else f"no file {script} in the repository"
        )
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = parse_args(argv)
    except SystemExit as e:
        if e.code in (0, None):  # --help, --version
            return None
        return f"does not parse: {err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else e}"
    command = next(a for a in argv if a not in ("-v", "--verbose"))
    if command in CONFIG_COMMANDS and not getattr(
        args, "plugin", None
    ):  # a plugin may add keys: not imported here
        keys = set(valid_keys())
        for word in argv[1:]:
            key = word.split("=", 1)[0]
            if "=" in word and not word.startswith("-") and "." in key and key not in keys:
                return f"unknown config key {key!r} in {word!r}"
    if command == "bench":
        known = benchmark_names()
        unknown = [n for n in args.names if benchmark_name(n) not in known and not is_placeholder(n)]
        if unknown:
            return f"unknown benchmark(s) {unknown}; known: {sorted(known)}"
    if command == "experiment" and args.name not in EXPERIMENTS and not is_placeholder(args.name):
        return f"unknown experiment {args.name!r}; known: {EXPERIMENTS.names()}"
    if command == "tune" and args.space and not is_placeholder(args.space):
        space = args.space
        if "/" in space:
            if space.startswith("tune_spaces/") and not (ROOT / space).is_file():
                return f"no space file {space}"
        elif space.removesuffix(".yaml") not in space_names():
            return f"no shipped space {space!r}; shipped: {space_names()}"
    return None


def test_blocks_found():
    """The extraction finds the README's and the docs' commands, and the runnable blocks it should run."""
    assert len(ALL_BLOCKS) > 30
    assert ROOT / "README.md" in RUNNABLE_FILES
    assert {p.name for p in RUNNABLE_FILES} >= {"README.md", "data.md"}
    commands = [
        a
        for b in ALL_BLOCKS
        for line in command_lines(b.text)
        for s in segments(line, {})
        for _, a in raydist_argvs(s)
    ]
    assert len(commands) > 80
    assert {a[0] for a in commands if not a[0].startswith("<")} >= {
        "train",
        "eval",
        "tune",
        "make-data",
        "search",
    }


def test_extraction_rules():
    """Continuations, comments, ``&&``/``;``/``|``, variables and the commands inside other commands."""
    variables: dict[str, str] = {}
    text = 'SIM="--preset tiny train.epochs=2"\nraydist train $SIM \\\n    --name x   # a comment: raydist bogus\n'
    segs = [s for line in command_lines(text) for s in segments(line, variables)]
    assert [a for s in segs for _, a in raydist_argvs(s)] == [
        ["train", "--preset", "tiny", "train.epochs=2", "--name", "x"]
    ]
    line = "export A=1; ray start --head && ray job submit --address X -- python jobs/eval.py --checkpoint C | tee log"
    argvs = [a for s in segments(line, {}) for _, a in raydist_argvs(s)]
    assert argvs == [["<script jobs/eval.py>"], ["eval", "--checkpoint", "C"]]
    assert check_argv(["trian"]) is not None  # a misspelt sub-command
    assert "unknown config key" in check_argv(["train", "train.epoch=2"])
    assert check_argv(["train", "--plugin", "mine.py", "loss.my_option=2"]) is None  # the plugin's key
    assert check_argv(["convert", "npy", "--out", "x"]) is not None  # a choice that does not exist
    assert check_argv(["bench", "nope"]) is not None and check_argv(["bench", "loss", "--smoke"]) is None
    assert (
        check_argv(["<script jobs/nope.py>"]) is not None and check_argv(["<script jobs/train.py>"]) is None
    )


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda b: b.where())
def test_bash_commands_parse(block: Block):
    """Every raydist command in a bash block of the README and the docs is one the CLI accepts."""
    variables: dict[str, str] = {}
    problems = []
    for line in command_lines(block.text):
        for seg in segments(line, variables):
            for written, argv in raydist_argvs(seg):
                why = check_argv(argv)
                if why:
                    problems.append(f"{written} {shlex.join(argv)}: {why}")
    assert not problems, f"{block.where()}: " + "\n".join(problems)


def ray_free_problems(block: Block) -> list[str]:
    """The commands of a runnable block that would start Ray (or run long): the test runs them unmarked."""
    problems = []
    for line in command_lines(block.text):
        for seg in segments(line, {}):
            if seg[:1] == ["ray"]:
                problems.append(f"{shlex.join(seg)}: starts or uses a Ray cluster")
            for _, argv in raydist_argvs(seg):
                cmd = argv[0] if argv else ""
                if cmd in ("tune", "experiment"):
                    problems.append(f"raydist {cmd}: starts Ray")
                elif cmd == "train" and "train.num_workers=0" not in argv and "--print-config" not in argv:
                    problems.append(
                        "raydist train without train.num_workers=0 (or --print-config): starts Ray"
                    )
                elif cmd == "bench" and "--smoke" not in argv:
                    problems.append("raydist bench without --smoke: minutes of measurement")
    return problems


def _bin_dir(tmp: Path) -> Path:
    """A folder whose ``raydist`` and ``python`` are this interpreter's, first on the blocks' PATH."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name, target in (
        ("raydist", f'exec "{sys.executable}" -m raydist.cli "$@"'),
        ("python", f'exec "{sys.executable}" "$@"'),
        ("python3", f'exec "{sys.executable}" "$@"'),
    ):
        script = bin_dir / name
        script.write_text(f"#!/usr/bin/env bash\n{target}\n")
        script.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("path", RUNNABLE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_runnable_blocks_run(path: Path, tmp_path: Path):
    """A file's runnable blocks, in order, in one fresh folder: each exits 0 within its time limit."""
    blocks = [b for b in bash_blocks(path) if b.runnable]
    problems = [f"{b.where()}: {p}" for b in blocks for p in ray_free_problems(b)]
    assert not problems, "runnable blocks must start no Ray (tests/test_docs_commands.py):\n" + "\n".join(
        problems
    )
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env.update(
        PATH=f"{_bin_dir(tmp_path)}{os.pathsep}{env.get('PATH', '')}",
        RAYDIST_CACHE=str(tmp_path / "cache"),
        MPLBACKEND="Agg",
        PYTHONPATH=str(ROOT),
    )
    for block in blocks:
        started = time.monotonic()
        try:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block.text],
                check=False,
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"{block.where()}: still running after {BLOCK_TIMEOUT_S} s\n{e.stdout}\n{e.stderr}")
        assert done.returncode == 0, (
            f"{block.where()} exited {done.returncode} after {time.monotonic() - started:.1f} s:\n{block.text}\n"
            f"--- stdout ---\n{done.stdout[-4000:]}\n--- stderr ---\n{done.stderr[-4000:]}"
        )


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub (and the docs site, mkdocs.yml's slugify) gives the headings of a Markdown file."""
    slugs = pytest.importorskip("pymdownx.slugs")  # the dev extra's mkdocs-material brings it
    slugify = slugs.slugify(case="lower")
    anchors, fence = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#+ ", line):
            anchors.add(slugify(line.lstrip("#").strip(), "-"))
    return anchors


def test_readme_links():
    """The README's links, which no docs build checks: every linked file exists, every anchor is a heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        path = ROOT / file if file else ROOT / "README.md"
        if not path.exists():
            problems.append(f"{target}: no file {file}")
        elif anchor and path.suffix == ".md" and anchor not in heading_anchors(path):
            problems.append(f"{target}: no heading with the anchor #{anchor} in {file or 'README.md'}")
    assert not problems, "\n".join(problems)
