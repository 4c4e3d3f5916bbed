"""The loss memory (raydist/losses/memory.py, ``loss.memory_size``): a queue of past global batches, extra negatives
of the ranking (MH, Matryoshka), InfoNCE and triplet losses. On 2 gloo workers over 10 steps the queue's bytes
are equal on both ranks, and the loss and gradients of a step that scores the queue equal a float64 computation
written here with loops on the concatenated batch + queue rows; an in-process run stopped and resumed holds a
bit-identical queue and logs the same next losses; the refusals name the key. The queue filling under two Ray
Train workers shares one fit with the corpus miner (tests/test_train_corpus_negatives.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from raydist.config import Config, ConfigError, apply_overrides, load_config, loss_problems
from raydist.distributed import NegativeSet, gather_step
from raydist.distributed.spawn import spawn
from raydist.losses import LossInputs, get_loss, nested_rank_loss
from raydist.losses.memory import EmbeddingMemory
from raydist.tasks import DataInfo, build_task, check_task_config
from raydist.train.hooks import Hook
from raydist.train.local import LocalRuntime
from raydist.train.loop import run_loop
from raydist.train.plan import check_memory_size, step_plan

WORLD, ROWS, FEATURES, DIM, SIZE, STEPS, CHECKED = 2, 4, 5, 6, 12, 10, 3
NESTING, WEIGHTS, MARGIN = [3, 6], [0.5, 2.0], 0.2
CASES = {  # kind → (task, overrides); the queue holds 12 rows: 1.5 steps of 8
    "ranking": ("pairs", {"loss.kind": "ranking", "loss.hardest": True, "model.nesting": NESTING}),
    "infonce": ("pairs", {"loss.kind": "infonce", "loss.temperature_init": 0.5}),
    "triplet": ("labels", {"loss.kind": "triplet", "loss.miner": "hardest"}),
}


class Embedder(nn.Module):
    """float64 linear maps: image and caption (pairs) or one embedding (labels); unit rows without nesting."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.image = nn.Linear(FEATURES, DIM)
        self.text = nn.Linear(FEATURES, DIM) if CASES[kind][0] == "pairs" else None  # labels: one embedding
        self.nested = "model.nesting" in CASES[kind][1]
        if kind == "infonce":
            loss = get_loss(kind)(config(kind))
            self.add_module(loss.module_name, loss.module(None))
        self.double()

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        img = self.image(x)
        cap = self.text(x.flip(1)) if self.text is not None else img
        if self.nested:  # raw: the Matryoshka views re-normalise each prefix
            return img, cap
        return nn.functional.normalize(img, dim=1), nn.functional.normalize(cap, dim=1)


def config(kind: str) -> Config:
    return apply_overrides(Config(), {**CASES[kind][1], "loss.memory_size": SIZE, "loss.margin": MARGIN})


def step_rows(step: int) -> tuple[Tensor, Tensor]:
    """The global batch of a step: features [8, F] and ids [8] (image ids or labels; repeats within the batch and
    with the queue's rows), the same on every rank."""
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(WORLD * ROWS, FEATURES, generator=g, dtype=torch.float64), torch.randint(
        0, 4, (8,), generator=g
    )


def kind_step(kind: str, loss, model: nn.Module, x: Tensor, ids: Tensor, step: int, rows: Tensor) -> Tensor:
    """One step's loss as a task computes it: gather, the kind in the Matryoshka sum (it reads and then fills
    the queue)."""
    img, cap = model(x)
    if CASES[kind][0] == "pairs":
        batch = gather_step({"img": img, "cap": cap}, {"image_id": ids, "sample_id": rows})
        names = ("img", "cap")
    else:
        batch = gather_step({"emb": img}, {"label": ids, "sample_id": rows})
        names = ("emb",)
    net = model.module if isinstance(model, DistributedDataParallel) else model
    extras = dict(net.logit_scale.named_parameters()) if kind == "infonce" else {}
    inputs = LossInputs(batch, NegativeSet(torch.arange(len(ids)), None), extras, 0, step, {})
    dims = NESTING if net.nested else None
    return nested_rank_loss(loss.loss, inputs, names, dims, WEIGHTS if dims else None)


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    mine = slice(rank * ROWS, (rank + 1) * ROWS)
    results = {}
    for kind in CASES:
        model, loss = Embedder(kind), get_loss(kind)(config(kind))
        ddp = DistributedDataParallel(model)
        for step in range(STEPS):
            x, ids = step_rows(step)
            value = kind_step(kind, loss, ddp, x[mine], ids[mine], step, torch.arange(8)[mine])
            value.backward()
            if step == CHECKED:
                grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
                results[kind] = {"loss": value.item(), "grads": grads}
            model.zero_grad()
        results[kind]["memory"] = loss.memory.state_dict()
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def loops(kind: str, model: Embedder) -> Tensor:
    """The loss of step ``CHECKED`` by loops over its 8 rows (with gradients) and the queue's 12 rows: the last 12
    rows of the steps before (the same model: no optimizer step), detached."""
    x, ids = step_rows(CHECKED)
    past = [step_rows(s) for s in range(CHECKED)]
    with torch.no_grad():
        mem_img, mem_cap = (torch.cat(t)[-SIZE:] for t in zip(*(model(px) for px, _ in past), strict=True))
    mem_ids = torch.cat([pid for _, pid in past])[-SIZE:]
    img, cap = model(x)
    n, m = len(ids), SIZE
    keys_img, keys_cap, keys_ids = (
        torch.cat([img, mem_img]),
        torch.cat([cap, mem_cap]),
        torch.cat([ids, mem_ids]),
    )
    if (
        kind == "triplet"
    ):  # batch-hard over batch + queue rows (anchors: this step's rows), Euclidean, hinged mean
        terms = []
        for a in range(n):
            pos = [j for j in range(n + m) if j != a and keys_ids[j] == ids[a]]
            neg = [j for j in range(n + m) if keys_ids[j] != ids[a]]
            if pos and neg:
                d = [(img[a] - keys_img[j]).norm() for j in range(n + m)]
                p, q = max(pos, key=lambda j: (d[j].item(), -j)), min(neg, key=lambda j: (d[j].item(), j))
                terms.append(torch.clamp(d[p] - d[q] + MARGIN, min=0))
        return sum(terms) / len(terms)
    total = 0.0
    views = [(NESTING[i], WEIGHTS[i]) for i in range(2)] if kind == "ranking" else [(DIM, 1.0)]
    for dim, c in views:

        def cut(z: Tensor, dim: int = dim) -> Tensor:
            return z[:, :dim] / z[:, :dim].norm(dim=1, keepdim=True) if kind == "ranking" else z

        qi, qc, ki, kc = cut(img), cut(cap), cut(keys_img), cut(keys_cap)
        value = 0.0
        for k in range(n):
            negatives = [j for j in range(n + m) if keys_ids[j] != ids[k]]
            if kind == "ranking":
                for q, keys in ((qi, kc), (qc, ki)):
                    if negatives:
                        value = value + torch.clamp(
                            MARGIN
                            - q[k] @ (qc if q is qi else qi)[k]
                            + max(q[k] @ keys[j] for j in negatives),
                            min=0,
                        )
            else:
                t = model.logit_scale.log_scale.exp()
                for q, own, keys in ((qi, qc, kc), (qc, qi, ki)):
                    scored = [k, *negatives]
                    value = (
                        value
                        - t * (q[k] @ own[k])
                        + torch.log(sum(torch.exp(t * (q[k] @ keys[j])) for j in scored))
                    )
        total = total + c * (value if kind == "ranking" else value / (2 * n))
    return total


def test_the_queue_keeps_the_last_rows_oldest_first_and_round_trips() -> None:
    memory = EmbeddingMemory(5)
    assert memory.rows() is None
    for start in (0, 3, 6):
        memory.push({"x": torch.arange(start, start + 3.0)[:, None], "id": torch.arange(start, start + 3)})
    assert memory.rows()["x"].flatten().tolist() == [4.0, 5.0, 6.0, 7.0, 8.0] and memory.filled == 5
    memory.push({"x": torch.arange(20.0, 27.0)[:, None], "id": torch.arange(7)})  # more than it holds
    assert memory.rows()["x"].flatten().tolist() == [22.0, 23.0, 24.0, 25.0, 26.0]
    again = EmbeddingMemory(5)
    again.load_state_dict(memory.state_dict())
    assert all(torch.equal(again.rows()[k], v) for k, v in memory.rows().items())


@pytest.mark.parametrize("kind", list(CASES))
def test_one_process_with_the_queue_matches_the_float64_loops(kind) -> None:
    model, loss = Embedder(kind), get_loss(kind)(config(kind))
    for step in range(CHECKED + 1):
        x, ids = step_rows(step)
        got = kind_step(kind, loss, model, x, ids, step, torch.arange(8))
    want = loops(kind, Embedder(kind))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    params = list(model.parameters())
    reference = Embedder(kind)
    for g, w in zip(
        torch.autograd.grad(got, params),
        torch.autograd.grad(loops(kind, reference), list(reference.parameters())),
        strict=True,
    ):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-13)
    assert loss.memory.filled == SIZE


@pytest.mark.slow
@pytest.mark.gloo
@pytest.mark.timeout(120)
def test_two_gloo_ranks_hold_the_same_queue_and_the_loops_gradients(tmp_path) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spawn(_worker, (str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for kind in CASES:
        first, second = (r[kind]["memory"] for r in ranks)
        assert first["filled"] == SIZE and first.keys() == second.keys()
        for name, rows in first["rows"].items():
            assert rows.numpy().tobytes() == second["rows"][name].numpy().tobytes(), (kind, name)
        reference = Embedder(kind)
        want = loops(kind, reference)
        want.backward()
        assert sum(r[kind]["loss"] for r in ranks) / WORLD == pytest.approx(want.item(), rel=1e-9)
        for rank in ranks:
            for name, p in reference.named_parameters():
                torch.testing.assert_close(rank[kind]["grads"][name], p.grad, rtol=1e-9, atol=1e-12, msg=name)


class Record(Hook):
    """Each step's loss and memory fill; the queue's state after step ``snap`` and before the first step."""

    def __init__(self, task, snap: int | None = None) -> None:
        self.task, self.snap, self.losses, self.fills, self.first_queue = task, snap, [], [], None

    def before_step(self, ctx) -> None:
        if self.first_queue is None:
            self.first_queue = self.task.loss_fn.memory.state_dict()

    def after_step(self, ctx, loss: float, stats: dict[str, float]) -> None:
        self.losses.append(loss)
        self.fills.append(stats["memory/fill"])
        if ctx.global_step == self.snap:
            self.queue = self.task.loss_fn.memory.state_dict()


class StopAfter(Hook):
    def __init__(self, steps: int) -> None:
        self.steps = steps

    def stop_requested(self, ctx) -> bool:
        return ctx.global_step + 1 == self.steps


def in_process(data_dir, run_dir, hooks=(), resume_from=None, snap=None):
    cfg = load_config(
        "tiny",
        overrides={
            "data.path": str(data_dir),
            "train.num_workers": 0,
            "train.epochs": 1,
            "train.epoch_steps": 7,
            "loss.memory_size": 150,  # 4.7 steps of 32 rows: the queue wraps
            "loss.memory_warmup_steps": 1,
        },
    )
    task = build_task(cfg, DataInfo.from_dataset(data_dir))
    plan = step_plan(cfg, task.info.task)
    record = Record(task, snap)
    run_loop(
        cfg,
        task,
        LocalRuntime(cfg, task, plan, run_dir),
        plan,
        hooks=[record, *hooks],
        resume_from=resume_from,
    )
    return record, run_dir


def test_an_in_process_run_resumes_with_the_same_queue_and_losses(tiny_dataset, tmp_path) -> None:
    stop = 4
    straight, _ = in_process(tiny_dataset, tmp_path / "a", snap=stop - 1)
    first, folder = in_process(tiny_dataset, tmp_path / "b", hooks=[StopAfter(stop)])
    checkpoint = sorted(Path(folder).glob("checkpoint_*"))[-1]
    resumed, _ = in_process(tiny_dataset, tmp_path / "c", resume_from=str(checkpoint))
    assert straight.fills == [32.0, 64.0, 96.0, 128.0, 150.0, 150.0, 150.0]
    assert first.losses + resumed.losses == straight.losses  # bit for bit, the queue's steps included
    want, got = straight.queue, resumed.first_queue
    assert (got["filled"], got["head"]) == (want["filled"], want["head"])
    for name, rows in want["rows"].items():
        assert rows.numpy().tobytes() == got["rows"][name].numpy().tobytes(), name


def test_bad_memory_settings_are_one_line_naming_the_key(tiny_dataset) -> None:
    pairs = DataInfo.from_dataset(tiny_dataset)
    with pytest.raises(ConfigError, match="loss.memory_size"):
        apply_overrides(Config(), {"loss.memory_size": -1})
    refused = apply_overrides(Config(), {"loss.kind": "siglip", "loss.memory_size": 64})
    with pytest.raises(ConfigError, match="reads it only with loss.kind ranking/infonce, not siglip"):
        check_task_config(refused, pairs)
    assert loss_problems(apply_overrides(Config(), {"loss.memory_size": 64, "loss.gather": False})) == [
        "loss.memory_size=64 needs loss.gather=true: the queue holds global batches"
    ]
    train = pairs.manifest.splits["train"].rows
    with pytest.raises(
        ConfigError, match=rf"loss.memory_size={train + 1} is larger than the training split \({train} rows\)"
    ):
        check_memory_size(apply_overrides(Config(), {"loss.memory_size": train + 1}), pairs)
    check_memory_size(apply_overrides(Config(), {"loss.memory_size": train}), pairs)
