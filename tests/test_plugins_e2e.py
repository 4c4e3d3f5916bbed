"""A plugin reaches every Ray process (issue #38): the documented example plugin (docs/examples/
contrastive_plugin.py: an image encoder and a labels loss with its own options), copied into a folder no import
path reaches, trains with `raydist train --plugin FILE` on two Ray Train workers and in a two-trial Tune sweep
whose space file names it. What the workers report -- the loss's per-step statistic (the workers it saw), the
encoder's weights in the checkpoint, the option values -- shows both were built and trained there. The trained
run then loads where its config names the plugin: `raydist eval` in a fresh process, and `raydist serve` with
two Ray Serve replicas answering /embed for an image. And the job ships the file: a Ray worker imports it from
Ray's copy after the original is deleted, as a node that never had it would.
Each command starts a private Ray instance: cluster step."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from test_tasks_images import write_colour_folders

from raydist.checkpoint.io import find_checkpoint
from raydist.checkpoint.names import CONFIG_FILE
from raydist.checkpoint.state_files import read_state
from raydist.distributed.spawn import free_port
from raydist.runfiles import STEPS_FILE

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "contrastive_plugin.py"
RUN = (
    "train.epochs=2",  # 2 steps an epoch: 36 train images, 16 a step
    "train.min_steps=0",
    "train.log_every=1",
    "train.batch_size=16",
    "train.num_workers=2",
)


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """(plugin file outside any package and off every path, an encoded labels dataset, a scratch folder)."""
    root = tmp_path_factory.mktemp("plugin_e2e")
    plugin = root / "elsewhere" / EXAMPLE.name
    plugin.parent.mkdir()
    shutil.copy(EXAMPLE, plugin)
    return plugin, write_colour_folders(root, seed=3), root


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done


def _steps(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / STEPS_FILE).read_text().splitlines()]


def _check_trained(run_dir: Path, plugin: Path, neg_margin: float, workers: int = 2) -> None:
    """The run's steps came from the plugin's loss on ``workers`` workers, its model has the plugin's encoder,
    its saved config names the plugin and the option."""
    steps = _steps(run_dir)
    assert [s["step"] for s in steps] == [1, 2, 3, 4]  # 2 epochs x 2 steps, every step logged
    assert all(s["stats"]["contrastive/workers"] == workers for s in steps)  # the workers' batch in the loss
    assert all(0 < s["loss"] < 10 for s in steps)
    checkpoint = find_checkpoint(run_dir)
    saved = yaml.safe_load((checkpoint / CONFIG_FILE).read_text())
    assert saved["plugins"] == [str(plugin)] and saved["loss"]["neg_margin"] == neg_margin
    assert saved["loss"]["kind"] == "contrastive" and saved["model"]["image_encoder"] == "tiny-conv"
    state = read_state(checkpoint)
    convs = [v for k, v in state["model"].items() if k.endswith("weight") and v.ndim == 4]
    assert [tuple(w.shape) for w in convs] == [(16, 3, 3, 3), (16, 16, 3, 3)]  # tiny-conv's two convolutions


def _serve_embeds_an_image(run: Path, image: Path, cwd: Path) -> list[float]:
    """`raydist serve RUN` (2 replicas): the /embed answer for one image; then SIGINT, exit 0."""
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    command = ["raydist", "serve", str(run), "--index", "test", "--port", str(port), "--replicas", "2"]
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.time() + 240
        while not any(line.startswith("serving on") for line in lines):
            assert proc.poll() is None and time.time() < deadline, "".join(lines)
            time.sleep(0.5)
        body = json.dumps({"images": [base64.b64encode(image.read_bytes()).decode()]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/embed", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as answer:
            embedded = json.loads(answer.read())
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(lines)
    (vector,) = embedded["embeddings"]
    return vector


def test_train_builds_and_trains_a_plugin_encoder_and_loss_on_two_workers(place):
    plugin, data, root = place
    argv = [
        "raydist",
        "train",
        "--plugin",
        os.path.relpath(plugin, root),
        "--preset",
        "tiny",
        "--data",
        str(data),
    ]
    argv += ["--storage", str(root / "runs"), "--name", "p", "model.image_encoder=tiny-conv"]
    _run([*argv, "loss.kind=contrastive", "loss.neg_margin=0.7", *RUN], cwd=root)
    _check_trained(root / "runs" / "p", plugin, 0.7)
    # the run loads where its config names the plugin: a fresh process, and Ray Serve's replicas
    evaluated = _run(
        ["raydist", "eval", "--checkpoint", str(root / "runs" / "p"), "--split", "test"], cwd=data
    )
    assert "best by val/r1" in evaluated.stdout and "\nnn1 " in evaluated.stdout  # the labels metrics
    vector = _serve_embeds_an_image(root / "runs" / "p", next((root / "src").rglob("*.png")), cwd=data)
    assert len(vector) == 64 and abs(sum(v * v for v in vector) - 1) < 1e-4  # tiny preset: unit, 64 dims


def test_a_sweep_of_two_trials_with_the_plugin(place):
    """Each trial trains in its Tune actor (`num_workers: 0`), a Ray process that imports the plugin from the
    space file's relative path; Ray Train workers importing it are the 2-worker run's above."""
    plugin, data, root = place
    space = root / "spaces" / "contrastive.yaml"
    space.parent.mkdir()
    space.write_text(
        yaml.safe_dump(
            {
                "metric": "val/r1",
                "search": "grid",
                "scheduler": "fifo",
                "resources": {"num_workers": 0, "cpus_per_worker": 0.5},
                "base": {  # the plugin's path is relative to the space file
                    "plugins": [os.path.relpath(plugin, space.parent)],
                    "model.image_encoder": "tiny-conv",
                    "loss.kind": "contrastive",
                    **dict(kv.split("=") for kv in RUN if "num_workers" not in kv),
                },
                "space": {"loss.neg_margin": {"grid": [0.4, 0.9]}},  # an option only the plugin declares
            }
        )
    )
    _run(
        [
            "raydist",
            "tune",
            str(space),
            "--preset",
            "tiny",
            "--data",
            str(data),
            "--storage",
            str(root / "tune"),
        ],
        root,
    )
    runs = sorted({p.parent for p in (root / "tune").rglob(STEPS_FILE)})
    assert len(runs) == 2
    margins = []
    for run in runs:
        checkpoint = find_checkpoint(run)
        margins.append(yaml.safe_load((checkpoint / CONFIG_FILE).read_text())["loss"]["neg_margin"])
        _check_trained(run, plugin, margins[-1], workers=1)
    assert sorted(margins) == [0.4, 0.9]


SHIPPED = """
import json, sys
from pathlib import Path

import ray

from raydist.runtime import init_ray

plugin = Path(sys.argv[1])
init_ray(1, plugins=[str(plugin)])  # a private Ray whose job ships the plugin (runtime_env py_modules)
plugin.unlink()  # gone from here on: a node without the file


@ray.remote
def imported(spec: str) -> list:
    from raydist.models.image_encoders import image_encoder_names
    from raydist.plugins import load_plugins

    (module,) = load_plugins([spec])
    return [module.__file__, "tiny-conv" in image_encoder_names()]


print(json.dumps(ray.get(imported.remote(str(plugin)))))
"""


def test_a_plugin_file_reaches_a_ray_worker_that_cannot_see_it(tmp_path):
    """The job ships the file: a Ray worker imports the plugin, under its module name, from Ray's copy after the
    original file was deleted (as on a node that never had it)."""
    plugin = tmp_path / "elsewhere" / EXAMPLE.name
    plugin.parent.mkdir()
    shutil.copy(EXAMPLE, plugin)
    done = _run(["python", "-c", SHIPPED, str(plugin)], cwd=tmp_path)
    where, registered = json.loads(done.stdout.strip().splitlines()[-1])
    assert registered and Path(where).name == EXAMPLE.name and Path(where) != plugin
    assert Path(where).read_text() == EXAMPLE.read_text()  # Ray's copy of it
