"""Config: presets, dotted overrides, type coercion and refusal of impossible combinations."""

import pickle
import subprocess
import sys

import pytest
import yaml

from raydist.config import (
    Config,
    ConfigError,
    dump_yaml,
    load_config,
    parse_overrides,
    preset_names,
    valid_keys,
)


def test_presets_ship_and_vsepp_recipe_matches_paper():
    assert {"tiny", "default", "vsepp-coco"} <= set(preset_names())
    c = load_config("vsepp-coco")
    assert (c.model.word_dim, c.model.embed_dim, c.loss.margin, c.train.batch_size) == (300, 1024, 0.2, 128)
    assert (c.train.lr, c.train.lr_decay_epoch, c.train.epochs, c.train.grad_clip) == (2e-4, 15, 30, 2.0)
    assert c.loss.hardest is True


def test_overrides_coerce_types():
    c = load_config(
        overrides=parse_overrides(
            ["loss.margin=0.1", "train.batch_size=64", "loss.hardest=false", "loss.negative_set_size=null"]
        )
    )
    assert c.loss.margin == 0.1 and c.train.batch_size == 64 and c.loss.hardest is False
    assert c.loss.negative_set_size is None
    assert load_config(overrides={"loss.negative_set_size": "32"}).loss.negative_set_size == 32


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"loss.marginn": 1}, "(?s)unknown config key 'loss.marginn'.*loss.margin"),
        ({"train.batch_size": "abc"}, "train.batch_size: expected an integer"),
        ({"loss.hardest": "maybe"}, "loss.hardest: expected true/false"),
        ({"loss.negative_set_size": 1}, "negative_set_size=1: must be >= 2"),
        ({"train.batch_size": 33, "train.num_workers": 2}, "must divide evenly"),
    ],
)
def test_bad_config_is_refused(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(overrides=overrides)


def test_unknown_preset_names_the_shipped_ones():
    with pytest.raises(ConfigError, match="tiny"):
        load_config("nope")


def test_dumped_yaml_round_trips_as_preset_file(tmp_path):
    c = load_config("tiny", overrides={"loss.margin": 0.33})
    f = tmp_path / "best.yaml"
    f.write_text(dump_yaml(c))
    assert load_config(preset_file=f) == c
    assert set(Config().flat()) == set(valid_keys())


def test_cli_prints_config_and_rejects_unknown_keys(tmp_path):
    run = [
        sys.executable,
        "-m",
        "raydist.cli",
        "train",
        "--preset",
        "tiny",
        "--print-config",
        "loss.margin=0.3",
    ]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert yaml.safe_load(out)["loss"]["margin"] == 0.3
    bad = subprocess.run(run[:-1] + ["loss.nope=1"], check=False, capture_output=True, text=True)
    assert (
        bad.returncode == 2
        and "unknown config key 'loss.nope'" in bad.stderr
        and "did you mean" in bad.stderr
    )
    assert "train.lr" not in bad.stderr  # the closest keys, not all of them


def test_cli_options_and_overrides_in_any_order():
    from raydist.cli import parse_args

    a = parse_args(["train", "loss.margin=0.3", "--preset", "tiny", "train.epochs=2", "--print-config"])
    assert a.preset == "tiny" and a.print_config and a.overrides == ["loss.margin=0.3", "train.epochs=2"]
    t = parse_args(
        ["tune", "tune_spaces/margin.yaml", "--preset", "tiny", "train.epochs=2", "--num-samples", "2"]
    )
    assert (t.space, t.preset, t.num_samples, t.overrides) == (
        "tune_spaces/margin.yaml",
        "tiny",
        2,
        ["train.epochs=2"],
    )


def test_a_config_pickles_and_loading_one_imports_no_torch():
    """A config crosses process boundaries pickled (its loss section's class is found by name); loading one in a
    fresh process imports no torch (the loss kinds' declarations are torch-free)."""
    cfg = load_config("tiny", overrides={"loss.margin": 0.3, "loss.kind": "ranking"})
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    code = "import sys; from raydist.config import load_config; load_config('tiny'); print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["False"]
