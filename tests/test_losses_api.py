"""The public surface of ``raydist.losses``: the names users import from the package, and the registered names
(miners, distances, similarities, reductions) the loss kinds take from the run config, refused before Ray
starts when unknown."""

from __future__ import annotations

import subprocess
import sys

import pytest

import raydist.losses
from raydist.config import Config, ConfigError, apply_overrides, load_config
from raydist.losses import get_loss, margin, nested, noise, triplets


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


def built(kind: str, **values: str):
    """Loss kind ``kind`` built from a config with the ``loss.<key>`` ``values``, as the driver builds it."""
    return get_loss(kind)(
        apply_overrides(Config(), {"loss.kind": kind, **{f"loss.{k}": v for k, v in values.items()}})
    )


def test_the_loss_kinds_build_the_registered_components_they_name() -> None:
    for miner in raydist.losses.MINERS.names():
        for distance in raydist.losses.DISTANCES.names():
            loss = built("triplet", miner=miner, distance=distance)
            assert (loss.miner.name, loss.distance.name, loss.miner.distance.name) == (
                miner,
                distance,
                distance,
            )
    for similarity in raydist.losses.SIMILARITIES.names():
        for reduction in ("sum", "mean"):
            loss = built("ranking", similarity=similarity, reduction=reduction)
            assert (loss.similarity.name, loss.reducer.name) == (similarity, reduction)


@pytest.mark.parametrize(
    "kind, values, message",
    [
        ("triplet", {"miner": "hardst"}, "loss.miner: unknown miner 'hardst'; did you mean hardest?"),
        (
            "margin",
            {"miner": "semihard-randm"},
            "loss.miner: unknown miner 'semihard-randm'; did you mean semihard-random",
        ),
        ("triplet", {"distance": "cosin"}, "loss.distance: unknown distance 'cosin'; did you mean cosine?"),
        (
            "ranking",
            {"similarity": "cosine"},
            "loss.similarity: unknown similarity 'cosine'; known: dot, order",
        ),
        ("ranking", {"reduction": "man"}, "loss.reduction: unknown reduction 'man'; did you mean mean"),
        (
            "ranking",
            {"reduction": "mean_nonzero"},
            "loss.reduction=mean_nonzero: the ranking loss sums its terms",
        ),
    ],
)
def test_an_unregistered_name_is_refused_where_the_loss_is_built(
    kind: str, values: dict, message: str
) -> None:
    """A config loads without the registries (no torch); the kind built from it refuses the name, naming the key."""
    cfg = load_config(overrides={"loss.kind": kind, **{f"loss.{k}": v for k, v in values.items()}})
    with pytest.raises(ConfigError, match=message.replace("?", r"\?")):
        get_loss(kind)(cfg)


def test_the_driver_refuses_an_unregistered_miner_before_ray_starts(labels_dataset) -> None:
    from raydist.tasks import DataInfo
    from raydist.tasks.registry import check_task_config

    cfg = load_config(
        overrides={"data.path": str(labels_dataset), "loss.kind": "margin", "loss.miner": "semihard-randm"}
    )
    with pytest.raises(
        ConfigError, match=r"loss.miner: unknown miner 'semihard-randm'; did you mean semihard-random"
    ):
        check_task_config(cfg, DataInfo.from_dataset(labels_dataset))


def test_config_and_names_import_without_torch() -> None:
    code = (
        "import sys, raydist.config, raydist.nesting; "
        "raydist.config.load_config(overrides={'loss.kind': 'triplet', 'loss.miner': 'hardst'}); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr[-500:]
