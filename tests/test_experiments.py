"""Experiments (raydist/experiments/): every sweep of every experiment resolves against the config and fits
the CPU budget (no Ray); equal optimizer steps in ``negatives``; the named datasets and the digits refusal
without scikit-learn; seed statistics; imports in raydist.experiments and raydist.benchmarks point one way;
and each experiment end to end in quick mode on the session's 4-CPU Ray."""

import ast
import importlib.util
import json
import math
from pathlib import Path

import pytest

from raydist.config import ConfigError, load_config
from raydist.experiments import experiment_names, get_experiment, run_experiment, summarise_saved
from raydist.experiments.datasets import experiment_dataset
from raydist.experiments.mh_vs_sh import collapse_value, stalled_epochs
from raydist.experiments.negatives import steps_per_epoch
from raydist.experiments.records import TrialRecord
from raydist.experiments.runner import sweep_space
from raydist.experiments.spec import Setup
from raydist.experiments.tables import clearly_above, spread
from raydist.tune.space import load_space, resolve_base_config, shipped_space_file
from raydist.tune.sweep import sweep_cpus

NAMES = [
    "gather",
    "gc-variance",
    "label-noise",
    "matryoshka",
    "mh-vs-sh",
    "negatives",
    "negatives-beyond-batch",
]
PACKAGES = ("raydist.experiments", "raydist.benchmarks")
ROOT = Path(__file__).resolve().parents[1]
TEST_CPUS = 4  # the session's Ray (tests/conftest.py); a local `raydist` Ray has max(cpu_count, 4)


def _setup(name: str, quick: bool) -> Setup:
    """A Setup as run_experiment builds it, for the embedded dataset's size (pairs) or 10 classes (labels)."""
    experiment = get_experiment(name)
    base = load_config(
        preset=experiment.preset,
        overrides={
            **load_space(shipped_space_file(experiment.space)).base,
            **(experiment.quick if quick else {}),
        },
    )
    rows, classes = (15000, None) if experiment.task == "pairs" else (1000, 10)
    seeds = experiment.seeds[:1] if quick else experiment.seeds
    return Setup(
        quick=quick, seeds=seeds, data_dir=Path("unused"), train_rows=rows, num_classes=classes, base=base
    )


def test_the_registry_names_every_experiment():
    assert experiment_names() == NAMES
    with pytest.raises(
        ValueError, match="unknown experiment 'nope'; registered: gather, gc-variance, label-noise"
    ):
        get_experiment("nope")


@pytest.mark.parametrize("quick", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_every_sweep_resolves_and_fits_the_cpus(name, quick):
    experiment = get_experiment(name)
    setup = _setup(name, quick)
    for sweep in experiment.sweeps(setup):
        space = sweep_space(experiment, sweep, setup.seeds)
        overrides = {**(experiment.quick if quick else {}), **sweep.overrides}
        cfg = resolve_base_config(space, preset=experiment.preset, overrides=overrides)
        assert sweep_cpus(space, cfg) <= TEST_CPUS, (name, sweep.label)
        assert [p.args for p in space.params if p.key == "train.seed"] == [setup.seeds]


def test_negatives_gives_every_size_the_same_optimizer_steps():
    experiment = get_experiment("negatives")
    setup = _setup("negatives", quick=False)
    base_steps = setup.base.train.epochs * steps_per_epoch(setup.train_rows, setup.base.train.batch_size)
    sizes = []
    for sweep in experiment.sweeps(setup):
        (members,) = sweep.grid.values()
        sizes += members
        rows = max(max(members), setup.base.train.batch_size)
        per_epoch = steps_per_epoch(setup.train_rows, rows)
        epochs = sweep.overrides.get("train.epochs", setup.base.train.epochs)
        assert base_steps <= epochs * per_epoch < base_steps + per_epoch, sweep.label
        warmup = sweep.overrides.get("loss.warmup_sh_epochs", setup.base.loss.warmup_sh_epochs)
        assert warmup * per_epoch >= setup.base.loss.warmup_sh_epochs * base_steps // setup.base.train.epochs
    assert sorted(sizes) == [2, 8, 32, 128, 512, 2048]


def test_negatives_leaves_out_sizes_larger_than_the_train_split_and_says_so():
    from dataclasses import replace

    from raydist.experiments.negatives import _verdict, sweeps

    setup = replace(_setup("negatives", quick=False), train_rows=1100)
    run = sorted(n for sweep in sweeps(setup) for n in next(iter(sweep.grid.values())))
    assert run == [2, 8, 32, 128, 512]
    assert _verdict({}, setup)[-1] == "Not run: n = 2048 (more rows per step than the 1100 train rows)."
    with pytest.raises(ValueError, match=r"holds \(100 rows\)"):
        sweeps(replace(setup, train_rows=100))


def test_negatives_beyond_batch_sizes_the_memory_in_global_batches_and_leaves_out_what_the_split_cannot_hold():
    from dataclasses import replace

    from raydist.experiments.negatives_beyond_batch import sweeps

    setup = _setup("negatives-beyond-batch", quick=False)
    batch = setup.base.train.batch_size
    for train_rows, run in ((15000, [0, 1, 4, 16]), (1100, [0, 1, 4])):  # the embedded set, the digit halves
        memory = {s.label: s.grid["loss.memory_size"] for s in sweeps(replace(setup, train_rows=train_rows))}
        assert memory == {
            "memory": [m * batch for m in run],
            "mined": [0],
            "infonce-memory": [m * batch for m in run],
            "infonce-mined": [0],
        }
    assert batch == 128 and memory["memory"] == [0, 128, 512]


def _beyond_batch_trials(kind: str, mined: int, size: int, rsums: list[float]) -> list[TrialRecord]:
    config = {
        "loss.kind": kind,
        "loss.mined_negatives": mined,
        "loss.memory_size": size,
        "train.batch_size": 128,
    }
    return [
        TrialRecord(
            "",
            f"{kind}-{mined}-{size}-{seed}",
            "TERMINATED",
            {**config, "train.seed": seed},
            [{"epoch": 1, "step": 256, "val/rsum": rsum, "time_total_s": 5.0}],
            "val/rsum",
            best_epoch=1,
            test={"rsum": rsum, "i2t_r1": rsum / 10, "t2i_r1": rsum / 10},
        )
        for seed, rsum in enumerate(rsums)
    ]


def test_negatives_beyond_batch_summary_writes_the_plot_and_says_where_more_negatives_did_not_help(tmp_path):
    from dataclasses import replace

    from raydist.experiments.negatives_beyond_batch import summarise

    setup = replace(_setup("negatives-beyond-batch", quick=False), train_rows=1100)
    records = [
        *_beyond_batch_trials("auto", 0, 0, [470.0, 472.0, 474.0]),
        *_beyond_batch_trials("auto", 0, 128, [480.0, 481.0, 482.0]),
        *_beyond_batch_trials("auto", 0, 512, [440.0, 442.0, 444.0]),
        *_beyond_batch_trials("auto", 4, 0, [468.0, 472.0, 476.0]),
        *_beyond_batch_trials("infonce", 0, 0, [485.0]),
        *_beyond_batch_trials("infonce", 0, 512, [479.0]),
    ]
    summary = summarise(records, tmp_path, setup)
    assert summary.figures == {"negatives_beyond_batch": tmp_path / "negatives_beyond_batch.png"}
    assert (tmp_path / "negatives_beyond_batch.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [(r["loss"], r["arm"]) for r in summary.rows] == [
        ("infonce", "in-batch"),
        ("infonce", "memory 512 (4×)"),
        ("ranking", "in-batch"),
        ("ranking", "memory 128 (1×)"),
        ("ranking", "memory 512 (4×)"),
        ("ranking", "mined 4"),
    ]
    assert summary.verdict == [
        "infonce memory 512 (4×): test rsum 479.0 vs in-batch 485.0 (-6.0): clearly below.",
        "ranking memory 128 (1×): test rsum 481.0 ± 1.0 vs in-batch 472.0 ± 2.0 (+9.0): clearly above.",
        "ranking memory 512 (4×): test rsum 442.0 ± 2.0 vs in-batch 472.0 ± 2.0 (-30.0): clearly below.",
        "ranking mined 4: test rsum 472.0 ± 4.0 vs in-batch 472.0 ± 2.0 (+0.0): within two standard errors.",
        "Not run: memory 2048 (16×) (larger than the 1100 train rows).",
    ]


def test_digits_without_scikit_learn_is_refused_clearly(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "sklearn" else real(name, *a)
    )
    with pytest.raises(
        ConfigError, match=r"digits dataset needs scikit-learn.*pip install 'raydist\[experiments\]'"
    ):
        experiment_dataset("labels", "digits", tmp_path, quick=False)


def test_a_dataset_of_the_wrong_task_is_refused(labels_dataset, tmp_path):
    with pytest.raises(ConfigError, match="needs a 'pairs' dataset, the folder holds 'labels'"):
        experiment_dataset("pairs", str(labels_dataset), tmp_path, quick=True)


def test_gc_variance_defaults_to_duplicated_data_and_judges_the_half_of_the_claim_it_has(tmp_path):
    from dataclasses import replace

    from raydist.data import load_manifest
    from raydist.experiments.gradclust_variance import summarise

    assert get_experiment("gc-variance").data == "duplicated" and get_experiment("label-noise").data is None
    dup, plain = (
        experiment_dataset("labels", name, tmp_path, quick=True) for name in ("duplicated", "no-duplicates")
    )
    assert [load_manifest(d).source["duplicates"] for d in (dup, plain)] == [16, 1]
    assert load_manifest(dup).splits["train"].rows == load_manifest(plain).splits["train"].rows == 640

    def trials(gc: float) -> list[TrialRecord]:  # epoch 1: clusters not formed yet, GC ≈ SGD
        return [
            TrialRecord(
                "",
                f"t{seed}",
                "TERMINATED",
                {"train.seed": seed},
                [
                    {
                        "epoch": e,
                        "gvar/sgd_nvar": 0.5,
                        "gvar/gc_nvar": 0.49 if e == 1 else gc + 0.01 * seed,
                        "gc/distortion": 100.0,
                    }
                    for e in (1, 2, 3)
                ],
                "val/r1",
            )
            for seed in range(3)
        ]

    setup = _setup("gc-variance", quick=False)
    verdict = {
        (d.name, gc): summarise(trials(gc), tmp_path, replace(setup, data_dir=d)).verdict[0]
        for d in (dup, plain)
        for gc in (0.2, 0.49)
    }
    assert verdict[(dup.name, 0.2)].startswith("Duplicated data (each train example ×16)")
    assert verdict[(dup.name, 0.2)].endswith(": held.") and verdict[(dup.name, 0.49)].endswith(
        "did not hold."
    )
    assert verdict[(plain.name, 0.49)].endswith(": held.") and verdict[(plain.name, 0.2)].endswith(
        "did not hold."
    )
    assert "GC/SGD 0.42 ± 0.02" in verdict[(dup.name, 0.2)]


def test_a_name_that_is_neither_a_folder_nor_a_named_dataset_lists_the_named_ones(tmp_path):
    with pytest.raises(
        ConfigError, match=r"--data nope: neither a dataset folder .*\n  synthetic-pairs \(pairs\): "
    ):
        experiment_dataset("pairs", "nope", tmp_path, quick=True)
    with pytest.raises(
        ConfigError,
        match=r"a 'labels' dataset; this experiment needs a 'pairs' one \(named: "
        r"synthetic-pairs, digit-halves, or a folder\)",
    ):
        experiment_dataset("pairs", "synthetic", tmp_path, quick=True)


def _imports(module: str, path: Path) -> set[str]:
    """Modules of :data:`PACKAGES` that ``module`` imports anywhere in its file (inside functions too); ``from
    P import x`` imports the package P (and P.x when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = (
                node.module if node.level == 0 else ".".join(module.split(".")[: -node.level] + [node.module])
            )
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        found |= {n for n in names if n.startswith(PACKAGES) and n != module}
    return found


def test_imports_in_the_experiments_and_benchmarks_packages_point_one_way():
    """No import cycle among the modules of raydist.experiments and raydist.benchmarks (``__init__`` included)."""
    graph = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package.replace(".", "/")).glob("*.py")):
            module = package if path.stem == "__init__" else f"{package}.{path.stem}"
            graph[module] = _imports(module, path)
    graph = {m: {n for n in deps if n in graph} for m, deps in graph.items()}
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for dep in sorted(graph[module]):
            assert state.get(dep) != "open", "import cycle: " + " → ".join([*trail, module, dep])
            if dep not in state:
                visit(dep, [*trail, module])
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module, [])
    assert "raydist.experiments.catalog" in graph["raydist.experiments"]  # the package sits above its catalog


def test_seed_statistics():
    s = spread([1.0, 2.0, 3.0, math.nan])
    assert (s.mean, s.std, s.low, s.high, s.n) == (2.0, 1.0, 1.0, 3.0, 3)
    assert s.cell() == "2.0 ± 1.0" and spread([5.0]).cell() == "5.0" and spread([]).cell() == "-"
    # difference 3 vs two standard errors 2·√(1/3 + 1/3) = 1.63
    assert clearly_above(spread([4.0, 5.0, 6.0]), s) and not clearly_above(spread([2.5, 3.5, 4.5]), s)


def test_mh_stall_is_found_at_two_batch_margin():
    config = {"loss.margin": 0.2, "train.batch_size": 128, "loss.reduction": "sum"}
    history = [
        {"epoch": 1, "loss/hardest": 0, "train/loss": 51.2},  # SH phase: not MH, not a stall
        {"epoch": 2, "loss/hardest": 1, "train/loss": 51.5},
        {"epoch": 3, "loss/hardest": 1, "train/loss": 30.0},
    ]
    record = TrialRecord("mh", "t", "TERMINATED", config, history, "val/rsum")
    assert collapse_value(config) == pytest.approx(51.2)
    assert stalled_epochs(record) == [2]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_quick_mode_runs_end_to_end(ray_cluster, tmp_path, name):
    out = run_experiment(name, quick=True, out_dir=tmp_path / name)
    trials = json.loads(Path(out["files"]["trials"]).read_text())
    assert trials and all(t["status"] == "TERMINATED" and t["test"] for t in trials), trials
    assert out["rows"] and out["verdict"][-1].startswith("Quick mode")
    assert out["table"].startswith("| ") and out["table"] in Path(out["files"]["summary"]).read_text()
    for figure in out["figures"].values():
        assert Path(figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert summarise_saved(out["out_dir"])["table"] == out["table"]
