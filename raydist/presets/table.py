"""``raydist presets``: every shipped preset with what it is for, the schedule it resolves to on a dataset (the
embedded one by default: epochs × steps, batch, workers) and its measured time (the preset file's ``# time:``
line)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from raydist.config import ConfigError, load_config, preset_names
from raydist.data import RaydistDataError
from raydist.tasks import DataInfo
from raydist.tasks.images import image_config_problems
from raydist.train.plan import resolve_schedule

TIME_TAG = "# time:"  # a preset file's measured run time, one comment line


def preset_header(name: str) -> tuple[str, str]:
    """A shipped preset's purpose (its first comment line, up to a colon) and its ``# time:`` line ("" when
    none)."""
    text = resources.files("raydist.presets").joinpath(f"{name}.yaml").read_text()
    comments = [line for line in text.splitlines() if line.startswith("#")]
    timed = [c[len(TIME_TAG) :].strip() for c in comments if c.startswith(TIME_TAG)]
    first = comments[0].lstrip("# ").strip() if comments else ""
    return first.split(": ")[0].rstrip(":,."), (timed[0] if timed else "")


def schedule_of(name: str, data_dir: Path) -> str:
    """``3 epochs × 64 steps = 192 steps, batch 32, 2 workers`` on ``data_dir``, or why it does not apply."""
    try:
        info = DataInfo.from_dataset(data_dir)
        cfg, _ = resolve_schedule(load_config(name, overrides={"data.path": str(data_dir)}), info)
    except (ConfigError, RaydistDataError, ValueError) as e:
        return f"not for this dataset ({str(e).splitlines()[0][:90]})"
    problems = image_config_problems(cfg, info)
    if problems:
        return "not for this dataset: " + problems[0].replace(str(data_dir), "the dataset")[:110]
    t = cfg.train
    note = (
        resolve_schedule(cfg, info)[1].split(";")[0].removeprefix("schedule: ")
    )  # as the resolved run reads
    workers = "in process" if t.num_workers == 0 else f"{t.num_workers} workers"
    return f"{note}, batch {t.batch_size}, {workers}"


def preset_table(data_dir: Path) -> str:
    """One block per shipped preset: name, purpose, schedule on ``data_dir``, measured time."""
    out = [f"presets (schedules on {data_dir}):"]
    for name in preset_names():
        about, took = preset_header(name)
        out.append(f"  {name}: {about}")
        out.append(f"      steps: {schedule_of(name, data_dir)}")
        if took:
            out.append(f"      time:  {took}")
    return "\n".join(out)
