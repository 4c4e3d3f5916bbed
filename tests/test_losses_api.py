"""The public surface of ``raydist.losses``: the names users import from the package, and the choice names
(raydist/choices.py) that the run config offers."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import pytest

import raydist.losses
from raydist import choices as names
from raydist.config import Config, ConfigError, LossSection, apply_overrides
from raydist.losses import margin, nested, noise, triplets


def test_package_exports_the_loss_functions_themselves() -> None:
    from raydist.losses import margin_loss, mine_triplets, nested_loss, pair_flip_rates, triplet_loss

    assert mine_triplets is triplets.mine_triplets
    assert triplet_loss is triplets.triplet_loss
    assert margin_loss is margin.margin_loss
    assert pair_flip_rates is noise.pair_flip_rates
    assert nested_loss is nested.nested_loss


def test_every_listed_name_resolves_and_others_do_not() -> None:
    assert all(getattr(raydist.losses, name) is not None for name in raydist.losses.__all__)
    assert set(raydist.losses.__all__) <= set(dir(raydist.losses))
    with pytest.raises(AttributeError, match="no_such_loss"):
        raydist.losses.no_such_loss  # noqa: B018


def test_config_choices_are_the_loss_names() -> None:
    fields = LossSection.model_fields
    assert raydist.losses.MINERS.names() == sorted(names.MINER_STRATEGIES)
    for miner in names.MINER_STRATEGIES:  # loss.miner accepts the registered miners, and nothing else
        assert apply_overrides(Config(), {"loss.miner": miner}).loss.miner == miner
    with pytest.raises(ConfigError, match="loss.miner: unknown miner 'hardst'; did you mean hardest?"):
        apply_overrides(Config(), {"loss.miner": "hardst"})
    assert get_args(fields["distance"].annotation) == names.DISTANCES
    assert get_args(fields["similarity"].annotation) == names.SIMILARITIES
    assert get_args(fields["reduction"].annotation) == names.REDUCTIONS


def test_config_and_names_import_without_torch() -> None:
    code = "import sys, raydist.config, raydist.choices, raydist.nesting; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr[-500:]
