"""Space files (raydist/tune/space.py): every distribution (and the Tune domain it becomes), nested
keys, and each error raised before Ray starts. No Ray instance here."""

from pathlib import Path

import pytest
import yaml

from raydist.config import ConfigError, load_config
from raydist.tune.space import (
    Param,
    load_space,
    parse_space,
    resolve_base_config,
    shipped_space_file,
    trial_configs,
)
from raydist.tune.sweep import tune_param_space

SHIPPED = sorted(Path(__file__).resolve().parents[1].joinpath("tune_spaces").glob("*.yaml"))


def space(entries: dict, **top) -> dict:
    return {"space": entries, **top}


ALL_DISTRIBUTIONS = {
    "loss.margin": {"uniform": [0.05, 0.4]},
    "train.lr": {"loguniform": [1e-4, 1e-2]},
    "train.seed": {"randint": [0, 10]},
    "train.batch_size": {"choice": [32, 64]},
    "loss.hardest": {"grid": [False, True]},
}


def test_every_distribution_parses():
    s = parse_space(space(ALL_DISTRIBUTIONS), name="all")
    assert s.params == (
        Param("loss.margin", "uniform", (0.05, 0.4)),
        Param("train.lr", "loguniform", (1e-4, 1e-2)),
        Param("train.seed", "randint", (0, 10)),
        Param("train.batch_size", "choice", (32, 64)),
        Param("loss.hardest", "grid", (False, True)),
    )
    assert s.keys == ["loss.margin", "train.lr", "train.seed", "train.batch_size", "loss.hardest"]
    # randint's high is exclusive (as in Tune): its largest value is high - 1.
    assert s.params[2].candidates() == [0, 9]


def test_tune_domains_match_the_file():
    from ray import tune
    from ray.tune.search.sample import Categorical, Float, Integer

    domains = tune_param_space(parse_space(space(ALL_DISTRIBUTIONS), name="all"))
    margin, lr, seed, batch = (
        domains[k] for k in ("loss.margin", "train.lr", "train.seed", "train.batch_size")
    )
    assert isinstance(margin, Float) and (margin.lower, margin.upper) == (0.05, 0.4)
    assert type(lr.get_sampler()) is type(tune.loguniform(1e-4, 1e-2).get_sampler())
    assert isinstance(seed, Integer) and (seed.lower, seed.upper) == (0, 10)
    assert isinstance(batch, Categorical) and batch.categories == [32, 64]
    assert domains["loss.hardest"] == {"grid_search": [False, True]}


def test_defaults():
    s = parse_space(space({"loss.margin": {"choice": [0.1]}}), name="d")
    assert (s.metric, s.mode, s.search, s.num_samples, s.max_concurrent_trials) == (
        "val/rsum",
        "max",
        "random",
        1,
        1,
    )
    assert (s.scheduler.kind, s.scheduler.max_t, s.scheduler.grace_period) == ("asha", None, 1)
    assert s.trial_cpus == 0.5 and s.base == {}


def test_nested_keys_equal_dotted_keys():
    nested = parse_space(
        space({"loss": {"margin": {"uniform": [0.1, 0.2]}, "negative_set_size": {"choice": [None, 8]}}}),
        name="n",
    )
    dotted = parse_space(
        space({"loss.margin": {"uniform": [0.1, 0.2]}, "loss.negative_set_size": {"choice": [None, 8]}}),
        name="n",
    )
    assert nested.params == dotted.params


def test_resources_and_base_become_overrides():
    s = parse_space(
        space(
            {"loss.margin": {"choice": [0.1]}},
            resources={"trial_cpus": 1, "num_workers": 4, "cpus_per_worker": 0.25},
            base={"train": {"epochs": 2}, "model.embed_dim": 32},
            scheduler="fifo",
        ),
        name="r",
    )
    assert s.trial_cpus == 1.0 and s.scheduler.kind == "fifo"
    assert s.base == {
        "train.epochs": 2,
        "model.embed_dim": 32,
        "train.num_workers": 4,
        "train.cpus_per_worker": 0.25,
    }
    cfg = resolve_base_config(s, preset="tiny", overrides={"train.num_workers": 2})
    assert (cfg.train.epochs, cfg.model.embed_dim, cfg.train.cpus_per_worker) == (2, 32, 0.25)
    assert cfg.train.num_workers == 2  # command-line overrides beat the space file


def test_trial_configs_cover_each_value_and_every_grid_combination():
    s = parse_space(
        space(
            {
                "train.batch_size": {"grid": [32, 64]},
                "loss.negative_set_size": {"grid": [None, 8, 128]},
                "loss.margin": {"uniform": [0.05, 0.4]},
            }
        ),
        name="g",
    )
    cfgs = trial_configs(s, load_config(preset="tiny"))
    combos = {(c.train.batch_size, c.loss.negative_set_size) for c in cfgs}
    assert {(b, n) for b in (32, 64) for n in (None, 8, 128)} <= combos
    assert {c.loss.margin for c in cfgs} >= {0.05, 0.4}


def test_shipped_spaces_resolve_against_the_default_preset():
    assert {p.stem for p in SHIPPED} >= {"margin", "negatives", "vsepp"}
    for path in SHIPPED:
        s = load_space(path)
        assert s.name == path.stem
        resolve_base_config(s, preset="default")


def test_a_new_space_is_one_file(tmp_path):
    path = tmp_path / "lr.yaml"
    path.write_text(yaml.safe_dump({"space": {"train.lr": {"loguniform": [1e-4, 1e-2]}}}))
    assert load_space(path).name == "lr"


@pytest.mark.parametrize(
    "data, message",
    [
        (
            space({"loss.margin": {"choice": [0.1]}}, sampler="random"),
            "sampler: unknown key; valid: metric, mode",
        ),
        ({"metric": "val/rsum"}, "'space' must map"),
        ([1, 2], "expected a mapping"),
        (
            space({"loss.margn": {"choice": [0.1]}}),
            "'loss.margn' is not a config key; did you mean: loss.margin",
        ),
        (
            space({"optim": {"lr": {"choice": [0.1]}}}),
            "'optim.lr' is not a config key; did you mean: train.lr",
        ),
        (space({"loss.margin": {"normal": [0, 1]}}), "unknown distribution 'normal'"),
        (space({"loss.margin": 0.2}), "needs exactly one distribution"),
        (space({"loss.margin": {"uniform": [0.1, 0.2], "choice": [0.3]}}), "needs exactly one distribution"),
        (space({"loss.margin": {"choice": []}}), "non-empty list"),
        (space({"loss.margin": {"grid": 0.1}}), "non-empty list"),
        (space({"loss.margin": {"uniform": [0.4, 0.1]}}), "low < high"),
        (space({"loss.margin": {"uniform": [0.1]}}), "low < high"),
        (space({"loss.margin": {"uniform": [0.1, "x"]}}), "low < high"),
        (space({"train.lr": {"loguniform": [0.0, 0.1]}}), "low > 0"),
        (space({"train.seed": {"randint": [0, 2.5]}}), "low < high"),
        (space({"train.batch_size": {"uniform": [32, 64]}}), "use choice or grid"),
        (space({"loss.hardest": {"randint": [0, 2]}}), "use choice or grid"),
        (space({"loss.reduction": {"uniform": [0.1, 0.2]}}), "loss.reduction holds str; use choice or grid"),
        (
            space({"model.mlp_hidden": {"randint": [8, 64]}}),
            "model.mlp_hidden holds list; use choice or grid",
        ),
        (space({"train.num_workers": {"choice": [1, 2]}}), "set it under 'resources:'"),
        (space({"data.path": {"choice": ["/a"]}}), "set by the sweep"),
        (space({"loss.margin": {"choice": [0.1]}}, mode="maximum"), "mode: expected 'max' or 'min'"),
        (space({"loss.margin": {"choice": [0.1]}}, search="bayes"), "search: expected 'random', 'grid' or"),
        (space({"loss.margin": {"choice": [0.1]}}, search="grid"), "every space entry to be a 'grid'"),
        (space({"loss.margin": {"grid": [0.1]}}, search="optuna"), "optuna cannot run 'grid'"),
        (space({"loss.margin": {"choice": [0.1]}}, num_samples=0), "num_samples=0: must be > 0"),
        (space({"loss.margin": {"choice": [0.1]}}, num_samples="4"), "num_samples: expected an integer"),
        (
            space({"loss.margin": {"choice": [0.1]}}, max_concurrent_trials=1.5),
            "max_concurrent_trials: expected an integer",
        ),
        (
            space({"loss.margin": {"choice": [0.1]}}, scheduler="hyperband"),
            "scheduler.type: expected 'asha' or",
        ),
        (
            space({"loss.margin": {"choice": [0.1]}}, scheduler={"type": "asha", "max_epochs": 3}),
            "scheduler.max_epochs: unknown key; valid: type, max_t",
        ),
        (
            space({"loss.margin": {"choice": [0.1]}}, scheduler={"type": "fifo", "max_t": 3}),
            "scheduler: fifo takes no other keys",
        ),
        (
            space({"loss.margin": {"choice": [0.1]}}, scheduler={"reduction_factor": 1}),
            "scheduler.reduction_factor=1: must be > 1",
        ),
        (
            space({"loss.margin": {"choice": [0.1]}}, resources={"gpus": 1}),
            "resources.gpus: unknown key; valid: trial_cpus",
        ),
        (
            space({"loss.margin": {"choice": [0.1]}}, resources={"trial_cpus": 0}),
            "resources.trial_cpus=0: must be > 0",
        ),
        (space({"loss.margin": {"choice": [0.1]}}, base={"train.num_workers": 1}), "under 'resources:'"),
        (space({"loss.margin": {"choice": [0.1]}}, base={"loss.margin": 0.3}), "both swept and set"),
        (space({"loss.margin": {"choice": [0.1]}}, base=[1]), "base: expected a mapping"),
    ],
)
def test_parse_errors(data, message):
    with pytest.raises(ConfigError, match=message):
        parse_space(data, name="bad")


@pytest.mark.parametrize(
    "entries, top, overrides, message",
    [
        # A value that does not coerce to the field's type.
        (
            {"train.batch_size": {"choice": [32, "big"]}},
            {},
            {},
            "(?s)train.batch_size='big' cannot run.*integer",
        ),
        ({"loss.hardest": {"grid": [True, "maybe"]}}, {}, {}, "expected true/false"),
        # Values that coerce but make an impossible config (validate()).
        ({"loss.margin": {"uniform": [-0.1, 0.2]}}, {}, {}, "(?s)loss.margin=-0.1 cannot run.*must be >= 0"),
        ({"train.batch_size": {"choice": [32, 33]}}, {}, {}, "must divide evenly"),
        # Each value is fine with the base batch of 32, but every grid combination runs: 17 > 16 rows
        # must divide over the 2 workers.
        (
            {"train.batch_size": {"grid": [16, 32]}, "loss.negative_set_size": {"grid": [8, 17]}},
            {},
            {},
            "(?s)train.batch_size=16, loss.negative_set_size=17 cannot run.*divide evenly",
        ),
        # The base config itself is checked too.
        ({"loss.margin": {"choice": [0.1]}}, {"base": {"train.epochs": 0}}, {}, "train.epochs=0"),
        ({"loss.margin": {"choice": [0.1]}}, {}, {"train.nope": 1}, "unknown config key"),
        ({"loss.margin": {"choice": [0.1]}}, {}, {"loss.margin": 0.3}, "sweeps loss.margin"),
        ({"loss.margin": {"choice": [0.1]}}, {"scheduler": {"grace_period": 5}}, {}, "exceeds max_t=3"),
    ],
)
def test_value_and_combination_errors(entries, top, overrides, message):
    s = parse_space(space(entries, **top), name="bad")
    with pytest.raises(ConfigError, match=message):
        resolve_base_config(s, preset="tiny", overrides=overrides)


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read space file"):
        load_space(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("space: {loss.margin: [unclosed")
    with pytest.raises(ConfigError, match="cannot read space file"):
        load_space(bad)


def test_a_bare_name_is_a_shipped_space(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no space files here
    margin = yaml.safe_load(SHIPPED[[p.stem for p in SHIPPED].index("margin")].read_text())
    for spec in ("margin", "margin.yaml"):
        s = load_space(spec)
        assert (s.name, s.source) == ("margin", margin)


def test_a_file_that_exists_wins_over_a_shipped_space(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    own = space({"train.lr": {"choice": [0.01]}})
    Path("margin.yaml").write_text(yaml.safe_dump(own))
    assert load_space("margin.yaml").source == own
    assert load_space("margin").keys == ["loss.margin"]  # no file called "margin": the shipped space


def test_an_unknown_name_lists_the_shipped_spaces(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    listed = ", ".join(p.stem for p in SHIPPED)
    with pytest.raises(ConfigError, match=f"no space file 'nope.yaml' in .*; shipped spaces: {listed}$"):
        load_space("nope.yaml")
    with pytest.raises(ConfigError, match=f"unknown space 'nope'; shipped spaces: {listed}$"):
        shipped_space_file("nope")
    with pytest.raises(ConfigError, match="cannot read space file"):  # a path with a folder is never a name
        load_space("somewhere/margin.yaml")


def test_a_missing_shipped_package_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("raydist.tune.space.SHIPPED_SPACES", "raydist.no_such_spaces")
    with pytest.raises(ConfigError, match=r"shipped spaces \(raydist.no_such_spaces\) are not installed"):
        load_space("margin")


def test_a_typo_in_a_space_gets_suggestions_not_every_key():
    with pytest.raises(ConfigError) as info:
        parse_space(space({"train.lrr": {"loguniform": [1e-4, 1e-2]}}), name="typo")
    assert len(str(info.value).splitlines()) == 1 and "did you mean: train.lr" in str(info.value)
