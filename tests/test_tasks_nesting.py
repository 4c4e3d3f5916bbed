"""Matryoshka nesting inside the tasks' losses: one gather, every prefix re-normalised, weights applied;
a single nesting dim equals the plain loss. References are computed independently (ranking_loss and
cross-entropy on explicit prefixes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from raydist.config import load_config
from raydist.data.stream import split_columns
from raydist.distributed import gather_step, step_generator
from raydist.losses import l2_normalize, ranking_loss
from raydist.tasks import DataInfo, StepContext, build_task, to_tensors
from raydist.train.plan import step_plan


def _pairs_loss(data_dir, **overrides):
    cfg = load_config("tiny", overrides={"data.path": str(data_dir), "train.num_workers": 1, **overrides})
    task = build_task(cfg, DataInfo.from_dataset(data_dir))
    torch.manual_seed(0)
    model = task.build_model().double()
    batch = to_tensors(task.transform(split_columns(data_dir, "train", task.columns)), "cpu")
    batch = {k: v[:32] for k, v in batch.items()}
    batch["image"] = batch["image"].double()
    enc = task.encode(model, batch)
    gathered = gather_step(enc.embeddings, enc.ids)
    negative_set = step_plan(cfg, task.info.task).draw(0, step_generator(0, 0))
    ctx = StepContext(epoch=5, global_step=0, rank=0, world=1)
    return task.loss(enc, gathered, negative_set, ctx, {}), enc


def test_pairs_nesting_single_dim_is_the_plain_loss(tiny_dataset):
    plain, _ = _pairs_loss(tiny_dataset)
    nested, _ = _pairs_loss(tiny_dataset, **{"model.nesting": "[64]"})
    torch.testing.assert_close(nested, plain, rtol=1e-12, atol=1e-12)


def test_pairs_nesting_is_the_weighted_sum_over_prefixes(tiny_dataset):
    got, enc = _pairs_loss(
        tiny_dataset, **{"model.nesting": "[4, 16, 64]", "loss.nesting_weights": "[2, 0.5, 1]"}
    )
    img, cap, ids = enc.embeddings["img"], enc.embeddings["cap"], enc.ids["image_id"]
    want = sum(
        c * ranking_loss(l2_normalize(img[:, :m]), l2_normalize(cap[:, :m]), image_ids=ids)
        for m, c in ((4, 2.0), (16, 0.5), (64, 1.0))
    )
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["cross_entropy", "triplet"])
def test_labels_nesting(labels_dataset, kind):
    cfg = load_config(
        "tiny",
        overrides={
            "data.path": str(labels_dataset),
            "train.num_workers": 1,
            "model.nesting": "[8, 64]",
            "loss.kind": kind,
            "loss.miner": "semihard-fixed",
        },
    )
    task = build_task(cfg, DataInfo.from_dataset(labels_dataset))
    torch.manual_seed(0)
    model = task.build_model()
    batch = {
        k: v[:40]
        for k, v in to_tensors(
            task.transform(split_columns(labels_dataset, "train", task.columns)), "cpu"
        ).items()
    }
    enc = task.encode(model, batch)
    got = task.loss(
        enc, gather_step(enc.embeddings, enc.ids, enabled=task.gathers), None, StepContext(0, 0, 0, 1), {}
    )
    emb, y = enc.embeddings["emb"], batch["label"]
    weight, bias = model.head.shared.weight, model.head.shared.bias
    ce = sum(
        F.cross_entropy((emb.detach() if kind != "cross_entropy" else emb)[:, :m] @ weight[:, :m].T + bias, y)
        for m in (8, 64)
    )
    if kind == "cross_entropy":
        torch.testing.assert_close(got, ce, rtol=1e-5, atol=1e-6)
    else:  # the metric part at each prefix, by brute force over semi-hard-fixed triplets
        want = ce
        for m in (8, 64):
            z = l2_normalize(emb[:, :m]).detach().double()
            d = torch.cdist(z, z)
            terms = []
            for a in range(len(y)):
                for p in range(len(y)):
                    if p == a or y[p] != y[a]:
                        continue
                    farther = [n for n in range(len(y)) if y[n] != y[a] and d[a, n] > d[a, p]]
                    if farther:
                        n = min(farther, key=lambda n: d[a, n])
                        terms.append(max(0.0, float(d[a, p] - d[a, n] + 0.2)))
            want = want + sum(terms) / len(terms)
        assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-4)


class _Prefix(torch.nn.Module):
    """``inner`` with its embeddings cut to the first ``m`` dims and re-normalised, written out here
    independently of the code under test."""

    def __init__(self, inner, m):
        super().__init__()
        self.inner, self.m = inner, m

    def image(self, x):
        return l2_normalize(self.inner.image(x)[:, : self.m])

    def text(self, tokens, lengths):
        return l2_normalize(self.inner.text(tokens, lengths)[:, : self.m])

    def forward(self, x):  # labels model: (embedding, logits)
        emb, logits = self.inner(x)
        return l2_normalize(emb[:, : self.m]), logits


def test_validation_reports_the_smallest_prefix_next_to_the_full_dim(tiny_dataset, labels_dataset):
    """min_dim_* (what a Matryoshka sweep can score on) equals the metric of the explicitly truncated model."""
    from raydist.eval.label_metrics import label_metrics

    for data, nesting, keys in (
        (tiny_dataset, "[8, 64]", ("rsum", "i2t_r1", "t2i_r1")),
        (labels_dataset, "[4, 32]", ("r1",)),
    ):
        cfg = load_config("tiny", overrides={"data.path": str(data), "model.nesting": nesting})
        task = build_task(cfg, DataInfo.from_dataset(data))
        torch.manual_seed(0)
        model = task.build_model()
        got = task.evaluate(model, "val")
        small = int(nesting[1:].split(",")[0])
        if keys == ("r1",):
            emb, _, labels = task.embed_split(_Prefix(model, small), "val")
            want = label_metrics(emb.numpy(), labels, ks=(1,))
        else:
            plain = build_task(
                load_config("tiny", overrides={"data.path": str(data)}), DataInfo.from_dataset(data)
            )
            want = plain.evaluate(_Prefix(model, small), "val")
            assert "min_dim_rsum" not in plain.evaluate(model, "val")  # no nesting: no extra metric
        for key in keys:
            assert got[f"min_dim_{key}"] == pytest.approx(want[key], abs=1e-9), key
        assert got[keys[0]] != pytest.approx(got[f"min_dim_{keys[0]}"])  # the full dim is reported too
