"""A new labels loss is one registered class: a supervised contrastive loss with its own option
(``loss.temperature``), registered here, trained through the labels task's path (the one Matryoshka sum over
the gathered batch) on 2 gloo workers and in one process, against a float64 single-process computation
written with loops; and the refusals of an unknown loss kind, another kind's option and a clashing option."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from pydantic import BaseModel, Field
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

import raydist
from raydist.cli import main
from raydist.config import Config, ConfigError, apply_overrides, load_config, loss_problems
from raydist.distributed import NegativeSet, gather_step
from raydist.distributed.spawn import spawn
from raydist.losses import (
    LOSSES,
    MINERS,
    LossInputs,
    LossKind,
    Miner,
    Triplets,
    get_loss,
    register_loss,
    register_miner,
    world_mean,
)
from raydist.registry import RegistryError
from raydist.tasks import DataInfo, Encoded, check_task_config
from raydist.tasks.labels import LabelsTask

WORLD, ROWS, FEATURES, DIM = 2, 6, 5, 6
LABELS = torch.tensor([0, 1, 2, 0, 1, 3, 2, 0, 1, 2, 4, 0])  # classes 3 and 4: one row, no positive
NESTING, WEIGHTS, TEMPERATURE = [3, 6], [0.5, 2.0], 0.3
OVERRIDES = {
    "loss.kind": "supcon",
    "loss.temperature": str(TEMPERATURE),
    "model.embed_dim": DIM,
    "model.nesting": NESTING,
    "loss.nesting_weights": WEIGHTS,
}


class SupCon(LossKind):
    """Supervised contrastive loss (Khosla et al. 2020) over the global batch: for each of this rank's rows a
    with a positive, ``−mean_p log softmax_{k≠a}(s_ak / τ)[p]`` over its positives p; the mean over anchors."""

    name = "supcon"
    task = "labels"

    class Options(BaseModel):
        temperature: float = Field(0.1, gt=0)

    def loss(self, inputs: LossInputs) -> Tensor:
        b = inputs.batch
        own = b.positions[:, None] == b.key_positions[None, :]
        logits = (b.local["emb"] @ b.keys["emb"].T / self.options.temperature).masked_fill(own, -torch.inf)
        log_prob = logits - logits.logsumexp(1, keepdim=True)
        positive = (b.local["label"][:, None] == b.keys["label"][None, :]) & ~own
        count = positive.sum(1)
        per_anchor = -log_prob.masked_fill(~positive, 0).sum(1) / count.clamp(min=1)
        return world_mean(per_anchor[count > 0].sum(), (count > 0).sum(), b)


@pytest.fixture
def supcon() -> Iterator[type[LossKind]]:
    """SupCon registered for one test (it leaves the registry and the config's keys after)."""
    register_loss(SupCon)
    yield SupCon
    LOSSES.unregister("supcon")


def embedder() -> nn.Module:
    """A float64 linear embedding (the nested prefixes re-normalise it), the same weights every call."""
    torch.manual_seed(0)
    return nn.Linear(FEATURES, DIM, dtype=torch.float64)


def features() -> Tensor:
    return torch.randn(
        WORLD * ROWS, FEATURES, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )


def reference(model: nn.Module, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """``Σ_m c_m · SupCon(normalize(z[:, :m]))`` on all rows in one process, by loops; with its gradients."""
    z, n, total = model(x), len(LABELS), 0.0
    for m, c in zip(NESTING, WEIGHTS, strict=False):
        p = z[:, :m] / z[:, :m].norm(dim=1, keepdim=True)
        terms = []
        for a in range(n):
            positives = [j for j in range(n) if j != a and LABELS[j] == LABELS[a]]
            if positives:
                log_denominator = torch.log(
                    sum(torch.exp(p[a] @ p[k] / TEMPERATURE) for k in range(n) if k != a)
                )
                terms.append(
                    -sum(p[a] @ p[j] / TEMPERATURE - log_denominator for j in positives) / len(positives)
                )
        total = total + c * sum(terms) / len(terms)
    names, params = zip(*model.named_parameters(), strict=False)
    return total, dict(zip(names, torch.autograd.grad(total, params), strict=False))


def task_loss(model: nn.Module, x: Tensor, labels: Tensor, rank: int, world: int) -> Tensor:
    """The labels task's loss kind for the config ``OVERRIDES`` in the task's Matryoshka sum, as a training step
    computes it (without the head's probe)."""
    cfg = apply_overrides(Config(), OVERRIDES)
    task = LabelsTask(cfg, DataInfo("labels", FEATURES, 5))
    assert isinstance(task.loss_fn, SupCon) and task.loss_fn.options.temperature == TEMPERATURE
    assert task.gathers and task.primary_metric == "r1"  # gathers by default; the head is a probe
    encoded = Encoded({"emb": model(x)}, {"label": labels, "sample_id": labels * 0})
    gathered = gather_step(encoded.embeddings, encoded.ids)
    negatives = NegativeSet(torch.arange(len(labels)), None)
    return task.nested_loss(task.loss_fn.loss, encoded, LossInputs(gathered, negatives, {}, 0, 0, {}))


def _worker(rank: int, init_file: str, x: Tensor, out_dir: str) -> None:
    torch.set_num_threads(1)
    if "supcon" not in LOSSES:  # a fresh process: the plugin registers when it is imported
        register_loss(SupCon)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    model = embedder()
    mine = slice(rank * ROWS, (rank + 1) * ROWS)
    ddp = DistributedDataParallel(model)  # held until the backward: its hooks average the gradients
    loss = task_loss(ddp, x[mine], LABELS[mine], rank, WORLD)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    torch.save({"loss": loss.item(), "grads": grads}, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_config_reads_the_new_kind_and_its_option(supcon) -> None:
    cfg = apply_overrides(Config(), OVERRIDES)
    assert (cfg.loss.kind, cfg.loss.temperature, Config().loss.temperature) == ("supcon", TEMPERATURE, 0.1)
    assert "loss.temperature" in cfg.flat()
    with pytest.raises(ConfigError, match=r"loss.temperature=0: must be > 0"):
        apply_overrides(Config(), {"loss.temperature": 0})


def test_one_process_matches_the_float64_loops(supcon) -> None:
    x = features()
    want, want_grads = reference(embedder(), x)
    model = embedder()
    got = task_loss(model, x, LABELS, 0, 1)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    got_grads = dict(
        zip(
            [n for n, _ in model.named_parameters()],
            torch.autograd.grad(got, model.parameters()),
            strict=False,
        )
    )
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-10, atol=1e-13)
    assert float(want.detach()) > 0 and all(g.abs().max() > 0 for g in want_grads.values())


@pytest.mark.slow
@pytest.mark.gloo
@pytest.mark.timeout(120)
def test_two_gloo_workers_match_the_float64_loops(supcon, tmp_path) -> None:
    """Both ranks hold the single-process gradients after DDP's average, and the mean over ranks of the
    returned values is the single-process loss (the cross-worker scaling of world_mean)."""
    x = features()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spawn(_worker, (str(tmp_path / "init"), x, str(tmp_path)), nprocs=WORLD)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    want, want_grads = reference(embedder(), x)
    assert sum(r["loss"] for r in ranks) / WORLD == pytest.approx(want.item(), rel=1e-12)
    for rank in ranks:
        for name, grad in want_grads.items():
            torch.testing.assert_close(rank["grads"][name], grad, rtol=1e-9, atol=1e-12)


def test_unknown_kind_and_another_kinds_option_are_refused(supcon) -> None:
    with pytest.raises(ConfigError, match=r"loss.kind: unknown loss kind 'supcn'; did you mean supcon\?"):
        apply_overrides(Config(), {"loss.kind": "supcn"})
    labels, pairs = DataInfo("labels", FEATURES, 5), DataInfo("pairs", FEATURES)
    cases = [
        (
            {"loss.kind": "triplet", "loss.temperature": 0.5},
            labels,
            "loss.temperature=0.5: the labels task reads it only with loss.kind supcon, not triplet (loss.kind=triplet)",
        ),
        (
            {"loss.temperature": 0.5},
            pairs,
            (
                "loss.temperature=0.5: the pairs task does not use it; it is for the labels task (leave it at "
                "its default, 0.1)"
            ),
        ),
        (
            {"loss.kind": "supcon"},
            pairs,
            "loss.kind=supcon: the pairs task trains loss.kind auto, ranking, infonce, siglip; supcon is for the labels task",
        ),
    ]
    for overrides, info, line in cases:
        with pytest.raises(ConfigError) as refused:
            check_task_config(apply_overrides(Config(), overrides), info)
        assert str(refused.value).splitlines()[1:] == [f"  {line}"], overrides
    check_task_config(apply_overrides(Config(), {"loss.kind": "supcon", "loss.temperature": 0.5}), labels)


def test_registration_is_refused_for_clashing_names_and_options_and_undone_by_unregister(supcon) -> None:
    class Clash(SupCon):
        name = "clash"

        class Options(BaseModel):
            margin: float = 0.3  # the shipped losses' loss.margin defaults to 0.2 (and is >= 0)

    with pytest.raises(RegistryError, match="option loss.margin differs from loss kind 'ranking'"):
        register_loss(Clash)
    with pytest.raises(RegistryError, match="already registered"):
        register_loss(SupCon)
    assert "clash" not in LOSSES
    LOSSES.unregister("supcon")
    with pytest.raises(ConfigError, match="unknown config key 'loss.temperature'"):
        apply_overrides(Config(), {"loss.temperature": 0.5})
    register_loss(SupCon)  # back for the fixture's teardown


EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "dcl_loss.py"


@pytest.fixture
def dcl() -> Iterator[type[LossKind]]:
    """The pairs loss of docs/metric-learning.md ("Adding a loss"), imported from its file as a plugin is."""
    spec = importlib.util.spec_from_file_location("raydist_docs_dcl_loss", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module.DecoupledContrastive
    LOSSES.unregister("dcl")


def dcl_loops(img: Tensor, cap: Tensor, image_ids: list[int], tau: float) -> Tensor:
    """The decoupled contrastive loss by loops: each row's negatives are the rows of other images."""
    n, total = len(image_ids), 0.0
    for i in range(n):
        negatives = [j for j in range(n) if image_ids[j] != image_ids[i]]
        for q, k in ((img, cap), (cap, img)):
            total = (
                total - q[i] @ k[i] / tau + torch.log(sum(torch.exp(q[i] @ k[j] / tau) for j in negatives))
            )
    return total / (2 * n)


def test_the_docs_example_loss_is_one_file_and_matches_the_loops(dcl, tiny_dataset, tmp_path) -> None:
    image_ids = [0, 0, 1, 2, 2, 2, 3, 4]  # rows sharing an image: not each other's negatives
    gen = torch.Generator().manual_seed(5)
    img, cap = (torch.randn(8, 4, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(2))
    rows, ids = torch.arange(8), torch.tensor(image_ids)
    cfg = apply_overrides(Config(), {"loss.kind": "dcl", "loss.temperature": "0.2"})
    batch = gather_step({"img": img, "cap": cap}, {"image_id": ids, "sample_id": rows})
    stats: dict[str, float] = {}
    got = dcl(cfg).loss(LossInputs(batch, NegativeSet(rows, None), {}, 0, 0, stats))
    want = dcl_loops(img, cap, image_ids, 0.2)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    for g, w in zip(
        torch.autograd.grad(got, (img, cap)), torch.autograd.grad(want, (img, cap)), strict=False
    ):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-13)
    assert set(stats) == {"dcl/positive_sim"}
    with pytest.raises(ConfigError, match="loss.temperature=0.5: the labels task does not use it"):
        check_task_config(apply_overrides(cfg, {"loss.temperature": 0.5}), DataInfo("labels", 4, 3))
    # the file as a plugin of an in-process run on image-caption data: trains, and says what it trained
    out = tmp_path / "run.json"
    args = ["train", "--data", str(tiny_dataset), "--preset", "tiny", "--storage", str(tmp_path), "--json"]
    overrides = ["train.num_workers=0", "train.epochs=1", "train.epoch_steps=2", "loss.kind=dcl"]
    assert main([*args, str(out), *overrides, "loss.temperature=0.05"]) == 0
    (epoch,) = json.loads(out.read_text())["history"]
    assert epoch["phase"] is None and 0 < epoch["train/dcl/positive_sim"] <= 1  # no MH/SH: its own stats
    # the tiny preset's SH warm-up (a ranking option) does not reach it; with the ranking loss it does
    tiny = {"data.path": str(tiny_dataset)}
    assert load_config("tiny", overrides={**tiny, "loss.kind": "dcl"}).loss.warmup_sh_epochs == 0
    assert load_config("tiny", overrides=tiny).loss.warmup_sh_epochs == 1


def nearest_negatives(
    emb: Tensor, labels: Tensor, *, margin: float, distance: str, generator=None
) -> Triplets:
    """A plugin miner: for every positive pair (a, p), the negative nearest to a by dot product."""
    same = labels[:, None] == labels[None, :]
    scores = (emb @ emb.T).masked_fill(same, -torch.inf)
    pairs = (same & ~torch.eye(len(labels), dtype=torch.bool)).nonzero(as_tuple=True)
    return Triplets(pairs[0], pairs[1], scores.argmax(1)[pairs[0]])


def test_a_registered_miner_is_a_loss_miner_value() -> None:
    register_miner("nearest", Miner(nearest_negatives))
    try:
        cfg = apply_overrides(Config(), {"loss.kind": "triplet", "loss.miner": "nearest", "loss.margin": 0.4})
        emb = torch.nn.functional.normalize(features()[:, :DIM], dim=1).requires_grad_()
        rows = torch.arange(len(LABELS))
        batch = gather_step({"emb": emb}, {"label": LABELS})
        got = get_loss("triplet")(cfg).loss(LossInputs(batch, NegativeSet(rows, None), {}, 0, 0, {}))
        terms = []  # the triplet loss of the nearest negatives, by loops
        for a in range(len(LABELS)):
            negatives = [k for k in range(len(LABELS)) if LABELS[k] != LABELS[a]]
            n = max(negatives, key=lambda k: (emb[a] @ emb[k]).item())
            for p in (p for p in range(len(LABELS)) if p != a and LABELS[p] == LABELS[a]):
                terms.append(((emb[a] - emb[p]).norm() - (emb[a] - emb[n]).norm() + 0.4).clamp(min=0))
        torch.testing.assert_close(got, sum(terms) / len(terms), rtol=1e-12, atol=0)
        assert MINERS.module_of("nearest") == __name__
    finally:
        MINERS.unregister("nearest")
    unknown = apply_overrides(Config(), {"loss.kind": "triplet", "loss.miner": "nearest"})
    with pytest.raises(ConfigError, match="loss.miner: unknown miner 'nearest'"):
        get_loss("triplet")(unknown)  # refused where the loss is built: on the driver, before Ray starts


def test_a_sweep_over_loss_kinds_accepts_the_options_of_each(supcon) -> None:
    """A sweep's trial config (loss.kind swept) is checked with any loss kind of the task: an option of another
    labels kind passes there, and is refused for a single run and on the pairs task."""
    labels, pairs = DataInfo("labels", FEATURES, 5), DataInfo("pairs", FEATURES)
    trial = apply_overrides(Config(), {"loss.kind": "margin", "loss.hinged": False, "loss.temperature": 0.5})
    check_task_config(trial, labels, any_loss_kind=True)
    with pytest.raises(ConfigError) as refused:
        check_task_config(trial, labels)
    assert str(refused.value).splitlines()[1:] == [
        "  loss.hinged=false: the labels task reads it only with loss.kind triplet, not margin (loss.kind=margin)",
        "  loss.temperature=0.5: the labels task reads it only with loss.kind supcon, not margin (loss.kind=margin)",
    ]
    with pytest.raises(ConfigError, match="loss.temperature=0.5: the pairs task does not use it"):
        check_task_config(apply_overrides(Config(), {"loss.temperature": 0.5}), pairs, any_loss_kind=True)


def test_a_new_module_in_the_kinds_package_is_found_without_a_list(tmp_path, monkeypatch) -> None:
    """A shipped loss kind is one module in raydist/losses/kinds/: the loss-kind registry imports the package's
    modules when it is first read."""
    from raydist.config import Config, apply_overrides
    from raydist.losses import LOSSES, kinds

    tag = tmp_path.name.replace("-", "_").lower()
    (tmp_path / f"new_{tag}.py").write_text(
        "from pydantic import BaseModel\n"
        "from raydist.losses.kinds.base import LossKind, register_loss\n\n\n"
        f"@register_loss\nclass New(LossKind):\n    name = 'new_{tag}'\n    task = 'labels'\n\n"
        f"    class Options(BaseModel):\n        new_{tag}_scale: float = 2.0\n"
    )
    monkeypatch.setattr(kinds, "__path__", [*kinds.__path__, str(tmp_path)])
    monkeypatch.setattr(LOSSES, "_discovered", False)  # as in a fresh process: the package not yet read
    try:
        assert f"new_{tag}" in LOSSES.names()
        assert LOSSES.module_of(f"new_{tag}") == f"raydist.losses.kinds.new_{tag}"
        cfg = apply_overrides(Config(), {"loss.kind": f"new_{tag}", f"loss.new_{tag}_scale": "3"})
        assert getattr(cfg.loss, f"new_{tag}_scale") == 3.0
    finally:
        LOSSES.unregister(f"new_{tag}")


DROPPED_KIND = """
from pydantic import BaseModel, Field

from raydist.losses.kinds.base import LossKind, register_loss


@register_loss
class Dropped(LossKind):
    name = "dropped"
    task = "labels"

    class Options(BaseModel):
        dropped_scale: float = Field(1.0, gt=0)

    def loss(self, inputs):
        import torch

        return torch.zeros(())
"""

TORCH_FREE_LOAD = """
import json, sys
import raydist
from raydist.config import ConfigError, load_config, valid_keys
cfg = load_config(overrides={"loss.kind": "dropped", "loss.dropped_scale": "3"})
try:
    load_config(overrides={"loss.kind": "dropped", "loss.dropped_scale": "0"})
    refused = ""
except ConfigError as e:
    refused = str(e)
print(json.dumps({
    "package": raydist.__file__,
    "scale": cfg.loss.dropped_scale,
    "key": "loss.dropped_scale" in valid_keys(),
    "refused": refused,
    "torch": "torch" in sys.modules,
}))
"""


def test_a_kind_module_dropped_into_the_package_is_found_by_a_torch_free_config_load(tmp_path) -> None:
    """A new file in raydist/losses/kinds/ (of a copy of the package, first on the path of a fresh process) is a
    loss kind a config load finds, its option a config key with its bounds, and no torch is imported."""
    copy = tmp_path / "raydist"
    shutil.copytree(Path(raydist.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    try:
        (copy / "losses" / "kinds" / "dropped.py").write_text(DROPPED_KIND)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
        run = subprocess.run(
            [sys.executable, "-c", TORCH_FREE_LOAD], env=env, cwd=tmp_path, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        got = json.loads(run.stdout.splitlines()[-1])
        assert Path(got["package"]).parent == copy
        assert got["scale"] == 3.0 and got["key"] and not got["torch"]
        assert "loss.dropped_scale=0: must be > 0" in got["refused"]
    finally:
        shutil.rmtree(copy)


@pytest.mark.parametrize(
    "options, steps, want",
    [
        # SH runs at least loss.warmup_sh_steps steps: ceil(10 / 4) = 3 epochs > the 1 asked for
        (
            {"loss.warmup_sh_epochs": 1, "loss.warmup_sh_steps": 10},
            4,
            ({"loss.warmup_sh_epochs": 3}, ["SH warm-up 3 epochs (raised for loss.warmup_sh_steps=10)"]),
        ),
        (
            {"loss.warmup_sh_epochs": 5, "loss.warmup_sh_steps": 10},
            4,
            ({"loss.warmup_sh_epochs": 5}, ["SH warm-up 5 epochs"]),
        ),
        (
            {"loss.warmup_sh_steps": 8},
            8,
            ({"loss.warmup_sh_epochs": 1}, ["SH warm-up 1 epochs (raised for loss.warmup_sh_steps=8)"]),
        ),
        ({"loss.warmup_sh_epochs": 2, "loss.hardest": False}, 4, ({}, [])),  # SH throughout: no warm-up
        ({}, 4, ({}, [])),
    ],
)
def test_the_ranking_kind_schedules_its_sh_warm_up(options, steps, want) -> None:
    cfg = apply_overrides(Config(), options)
    assert get_loss("ranking").schedule(cfg, steps) == want
    assert get_loss("triplet").schedule(cfg, steps) == ({}, [])  # a kind without a schedule


def test_the_negative_set_and_its_checks_belong_to_the_ranking_kind() -> None:
    ranking, triplet = get_loss("ranking"), get_loss("triplet")
    cfg = apply_overrides(Config(), {"loss.negative_set_size": 64})
    assert ranking.negative_set_size(cfg) == 64 and triplet.negative_set_size(cfg) is None
    assert ranking.negative_set_size(Config()) is None
    elastic = {"train.num_workers": 3, "train.min_workers": 2, "train.batch_size": 48}
    cases = [
        ({"loss.negative_set_size": 1}, ["loss.negative_set_size=1: must be >= 2 (or null)"]),
        ({"loss.negative_set_size": 32}, []),  # within the batch: any size from 2
        ({"loss.negative_set_size": 102, **elastic}, []),  # 102 rows split over 2 and 3 workers
        (
            {"loss.negative_set_size": 100, **elastic},
            [
                "loss.negative_set_size=100 > batch size must divide evenly over every worker count from "
                "train.min_workers=2 to train.num_workers=3"
            ],
        ),
        (
            {"loss.negative_set_size": 129, "train.num_workers": 2},
            ["loss.negative_set_size=129 > batch size must divide evenly over train.num_workers=2"],
        ),
    ]
    for overrides, want in cases:
        cfg = apply_overrides(Config(), overrides)
        assert ranking.problems(cfg) == want, overrides
        assert triplet.problems(cfg) == [], overrides
        assert loss_problems(cfg) == want, overrides  # auto: every kind's checks
        assert loss_problems(cfg, "cross_entropy") == [], overrides
