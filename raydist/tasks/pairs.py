"""Task ``pairs``: image–caption retrieval (VSE++). Captions are tokenised in the data pipeline; the loss
is the bidirectional hinge ranking loss over negatives mined from the global batch (SH warm-up, then MH);
evaluation is the VSE++ retrieval protocol."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from raydist.data import Vocab, split_arrays
from raydist.data.transforms import CaptionTransform
from raydist.distributed import GatheredBatch, NegativeSet, rank_ranking_loss
from raydist.eval.evaluate import embed_split, evaluate_arrays, image_rows
from raydist.eval.retrieve import RetrievalSet
from raydist.losses import mh_collapse_value
from raydist.models import build_model
from raydist.tasks.base import Encoded, StepContext, Task, nested_sum, smallest_prefix


class PairsTask(Task):
    """Image–caption pairs: one row per caption, captions of an image share its ``image_id``."""

    name = "pairs"
    columns = ("image_id", "sample_id", "image", "caption")
    primary_metric = "rsum"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.vocab = Vocab.load(self.info.files["vocab.json"])
        self._splits: dict[str, tuple] = {}
        self.fallback_epochs: list[int] = []  # epochs switched back to SH after a stalled MH epoch

    def transform(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Features as float32 [B, D]; captions as token ids padded to ``data.max_caption_len`` + lengths."""
        return self.stream_transform()(batch)

    def stream_transform(self) -> CaptionTransform:
        return CaptionTransform(self.vocab, self.cfg.data.max_caption_len)

    def build_model(self) -> nn.Module:
        return build_model(self.cfg, self.info.feature_dim, len(self.vocab))

    def encode(self, model: nn.Module, batch: dict[str, Tensor]) -> Encoded:
        lengths = batch["lengths"]
        tokens = batch["tokens"][:, : int(lengths.max())]
        img, cap = model(batch["image"], tokens, lengths)
        return Encoded({"img": img, "cap": cap}, {"image_id": batch["image_id"], "sample_id": batch["sample_id"]})

    def hardest(self, epoch: int) -> bool:
        """MH after ``loss.warmup_sh_epochs`` epochs of SH (when ``loss.hardest``), except the epochs
        switched back to SH after a stalled MH epoch."""
        lo = self.cfg.loss
        return lo.hardest and epoch >= lo.warmup_sh_epochs and epoch not in self.fallback_epochs

    def collapse_value(self) -> float:
        """MH's loss when every score is equal (:func:`mh_collapse_value` of the global query batch)."""
        return mh_collapse_value(self.cfg.train.batch_size, self.cfg.loss.margin, self.cfg.loss.reduction)

    def end_epoch(self, epoch: int, metrics: dict[str, Any]) -> list[str]:
        """After an MH epoch whose mean loss (the same on every rank) sits within 1 % of the collapse value:
        a warning, and with ``loss.stall_fallback`` the next epoch runs SH."""
        collapse = self.collapse_value()
        if not self.hardest(epoch) or abs(metrics["train/loss"] - collapse) > 0.01 * collapse:
            return []
        note = (f"MH loss {metrics['train/loss']:.4g} sits at its collapse value 2·N·margin = {collapse:.4g} "
                "(all scores equal)")  # fmt: skip
        if self.cfg.loss.stall_fallback:
            self.fallback_epochs.append(epoch + 1)
            return [note + f"; epoch {epoch + 2} runs SH, then MH again"]
        return [note + "; consider loss.warmup_sh_steps or loss.stall_fallback=true"]

    def state_dict(self) -> dict[str, Any]:
        return {"fallback_epochs": list(self.fallback_epochs)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fallback_epochs = list(state["fallback_epochs"])

    def loss(
        self, encoded: Encoded, gathered: GatheredBatch, negative_set: NegativeSet, ctx: StepContext,
        stats: dict[str, float],
    ) -> Tensor:  # fmt: skip
        lo = self.cfg.loss

        def loss_at(prefix: Callable[[Tensor], Tensor], largest: bool) -> Tensor:
            return rank_ranking_loss(
                gathered.view(prefix, ("img", "cap")), negative_set, ids="image_id", margin=lo.margin,
                hardest=self.hardest(ctx.epoch), reduction=lo.reduction, similarity=lo.similarity,
                tile=lo.tile, stats=stats if largest else None,
            )  # fmt: skip

        return nested_sum(self.cfg, loss_at)

    def evaluate(self, model: nn.Module, split: str, device: torch.device | str = "cpu") -> dict[str, float]:
        """VSE++ retrieval metrics (R@1/5/10, medr, meanr, rsum); ``eval.folds`` except on val."""
        return evaluate_arrays(
            model, self.vocab, self._arrays(split), max_len=self.cfg.data.max_caption_len,
            folds=1 if split == "val" else self.cfg.eval.folds, batch_size=self.cfg.eval.batch_size,
            device=device, prefix_dim=smallest_prefix(self.cfg),
        )  # fmt: skip

    def embed(self, model: nn.Module, split: str, device: torch.device | str = "cpu") -> RetrievalSet:
        """Two-way: captions (queries, keyed by their image's row) search the images (database, one row per
        image in first-appearance order) and the other way round."""
        image_ids, sample_ids, features, captions = self._arrays(split)
        emb = embed_split(model, self.vocab, features, captions, image_ids, max_len=self.cfg.data.max_caption_len,
                          batch_size=self.cfg.eval.batch_size, device=device)  # fmt: skip
        first, _ = image_rows(image_ids)
        return RetrievalSet(self.name, "t2i", emb.images.numpy(), emb.captions.numpy(), np.arange(len(first)),
                            emb.cap_to_img, image_ids[first], sample_ids, two_way=True, split=split)  # fmt: skip

    def _arrays(self, split: str) -> tuple:
        """``(image_ids, sample_ids, features, captions)`` of a split, read once."""
        if split not in self._splits:
            self._splits[split] = split_arrays(self.info.data_dir, split, verify=False)
        return self._splits[split]

    def phase(self, epoch: int) -> str:
        """"SH" (all negatives) or "MH" (hardest negative): the loss scale differs by about the batch size."""
        return "MH" if self.hardest(epoch) else "SH"

    def epoch_metrics(self, epoch: int) -> dict[str, Any]:
        return {"loss/hardest": int(self.hardest(epoch))}

    def summary(self, metrics: dict[str, Any]) -> str:
        return (
            f"val rsum {metrics['rsum']:.1f} (i2t R@1 {metrics['i2t_r1']:.1f}, t2i R@1 {metrics['t2i_r1']:.1f})"
        )

    def history_columns(self) -> list[tuple[str, str]]:
        return [("i2t_r1", "i2t R@1"), ("t2i_r1", "t2i R@1"), ("rsum", "rsum")]
