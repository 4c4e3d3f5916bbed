"""raydist.console.emit: a terminal shows progress lines as one bar redrawn in place; logs and pipes get
every line unchanged."""

import io

import pytest

from raydist import console

PROGRESS = ["[raydist] epoch 1/5 step 20/117 (17%) samples/s 1234 ETA 3m05s loss 12.3",
            "[raydist] epoch 1/5 step 40/117 (34%) samples/s 1250 ETA 2m50s loss 11.0"]  # fmt: skip
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
    assert first == "[raydist] [###.................] " + PROGRESS[0][len("[raydist] "):]  # 17% of 20 = 3
    assert second.startswith("[raydist] [######..............] epoch 1/5 step 40/117")  # 34% → 6
    assert second.endswith("loss 11.0\n" + EPOCH + "\n")  # the bar line is closed before the epoch line
    assert text.count("\n") == 2


@pytest.mark.parametrize("line", [EPOCH, "[raydist] schedule: 5 epochs × 117 steps", "epoch 1/5 step 2/3 (66%)"])
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
