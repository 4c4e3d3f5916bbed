"""``loss.kind=ranking`` (task pairs): VSE++'s bidirectional hinge ranking loss over negatives mined from the
global batch of all workers, with its SH warm-up, MH phase and stall fallback. Its options, schedule and checks
are torch-free; the loss is :func:`raydist.losses.cross_worker_ranking.rank_ranking_loss` (imported with torch
when the loss is computed)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pydantic import Field

from raydist.config.base import ConfigError
from raydist.config.checks import worker_counts_multiple
from raydist.losses.kinds.base import LossKind, MemoryOptions, MinedOptions, MiningOptions, register_loss

if TYPE_CHECKING:
    from torch import Tensor

    from raydist.config import Config
    from raydist.losses.inputs import LossInputs


class RankingOptions(MinedOptions, MemoryOptions, MiningOptions):
    """``loss.kind=ranking`` (task pairs): VSE++'s hinge ranking loss and its negative set."""

    hardest: bool = True  # True = MH (VSE++, hardest-negative miner), False = SH (all negatives)
    warmup_sh_epochs: int = Field(0, ge=0)  # epochs of SH before switching to MH
    warmup_sh_steps: int = Field(0, ge=0)  # ... at least this many SH steps (raises warmup_sh_epochs)
    stall_fallback: bool = True  # an MH epoch whose loss sits at the collapse value 2·N·margin → one SH epoch
    reduction: str = "sum"  # a registered reducer (raydist.losses.reducers): "sum" (VSE++) or "mean"
    similarity: str = "dot"  # a registered similarity (raydist.losses.similarity): "dot" or "order"
    negative_set_size: int | None = None  # None = the global batch
    tile: int = Field(4096, ge=1)  # keys per tile of the hardest-negative miner (memory O(rows · tile))


@register_loss
class RankingLoss(LossKind):
    """VSE++ ranking loss: MH (hardest negative, ``loss.hardest``) after ``loss.warmup_sh_epochs`` epochs of SH
    (sum of hinges); an MH epoch stalled at its collapse value is reported and, with ``loss.stall_fallback``,
    followed by one SH epoch."""

    name = "ranking"
    task = "pairs"
    Options = RankingOptions

    @classmethod
    def schedule(cls, cfg: Config, steps_per_epoch: int) -> tuple[dict[str, Any], list[str]]:
        """MH's SH warm-up: ``loss.warmup_sh_epochs`` raised until SH runs ``loss.warmup_sh_steps`` steps (small
        datasets have few steps per epoch); none without ``loss.hardest``."""
        o = cls.read_options(cfg)
        warmup = max(o.warmup_sh_epochs, math.ceil(o.warmup_sh_steps / steps_per_epoch)) if o.hardest else 0
        if not warmup:
            return {}, []
        raised = (
            f" (raised for loss.warmup_sh_steps={o.warmup_sh_steps})" if warmup != o.warmup_sh_epochs else ""
        )
        return {"loss.warmup_sh_epochs": warmup}, [f"SH warm-up {warmup} epochs{raised}"]

    @classmethod
    def negative_set_size(cls, cfg: Config) -> int | None:
        """``loss.negative_set_size``: the keys of each step (None: the global batch)."""
        return cls.read_options(cfg).negative_set_size

    @classmethod
    def problems(cls, cfg: Config) -> list[str]:
        """``loss.negative_set_size``: at least 2, and one larger than the batch (the rows every worker embeds)
        must divide evenly over every worker count the run may have; and the loss memory's checks."""
        size, t, memory = cls.negative_set_size(cfg), cfg.train, super().problems(cfg)
        if size is None:
            return memory
        if size < 2:
            return [*memory, f"loss.negative_set_size={size}: must be >= 2 (or null)"]
        if size > t.batch_size and size % worker_counts_multiple(t):
            workers = (
                f"train.num_workers={t.num_workers}"
                if t.min_workers is None
                else f"every worker count from train.min_workers={t.min_workers} to train.num_workers={t.num_workers}"
            )
            return [*memory, f"loss.negative_set_size={size} > batch size must divide evenly over {workers}"]
        return memory

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Built (on the driver first, before Ray starts) with its similarity and reducer objects: a name none is
        registered under is a ConfigError naming the key, and so is a reducer that cannot reduce a sum of terms."""
        from raydist.losses.components import registered
        from raydist.losses.reducers import REDUCERS
        from raydist.losses.similarity import SIMILARITIES

        super().__init__(*args, **kwargs)
        o = self.options
        self.similarity = registered(SIMILARITIES, "loss.similarity", o.similarity)()
        reducer = registered(REDUCERS, "loss.reduction", o.reduction)
        if not reducer.reduces_totals():
            usable = [name for name in REDUCERS.names() if REDUCERS.get(name).reduces_totals()]
            raise ConfigError(
                f"loss.reduction={o.reduction}: the ranking loss sums its terms as it goes; use {', '.join(usable)}"
            )
        self.reducer = reducer()
        self.fallback_epochs: list[int] = []  # epochs switched back to SH after a stalled MH epoch

    def hardest(self, epoch: int) -> bool:
        """MH after ``loss.warmup_sh_epochs`` epochs of SH (when ``loss.hardest``), except the epochs
        switched back to SH after a stalled MH epoch."""
        o = self.options
        return o.hardest and epoch >= o.warmup_sh_epochs and epoch not in self.fallback_epochs

    def loss(self, inputs: LossInputs) -> Tensor:
        from raydist.losses.cross_worker_ranking import rank_ranking_loss

        o = self.options
        loss = rank_ranking_loss(
            inputs.batch,
            inputs.negative_set,
            ids="image_id",
            margin=o.margin,
            hardest=self.hardest(inputs.epoch),
            reduction=self.reducer,
            similarity=self.similarity,
            tile=o.tile,
            stats=inputs.stats,
            memory=self.extra_keys(inputs),
        )
        self.remember(inputs)
        return loss

    def collapse_value(self) -> float:
        """MH's loss when every score is equal (:func:`raydist.losses.mh_collapse_value` of the global query
        batch)."""
        from raydist.losses.ranking import mh_collapse_value

        return mh_collapse_value(self.cfg.train.batch_size, self.options.margin, self.reducer)

    def end_epoch(self, epoch: int, metrics: dict[str, Any]) -> list[str]:
        """After an MH epoch whose mean loss (the same on every rank) sits within 1 % of the collapse value:
        a warning, and with ``loss.stall_fallback`` the next epoch runs SH."""
        collapse = self.collapse_value()
        if not self.hardest(epoch) or abs(metrics["train/loss"] - collapse) > 0.01 * collapse:
            return []
        note = (
            f"MH loss {metrics['train/loss']:.4g} sits at its collapse value 2·N·margin = {collapse:.4g} "
            "(all scores equal)"
        )
        if self.options.stall_fallback:
            self.fallback_epochs.append(epoch + 1)
            return [note + f"; epoch {epoch + 2} runs SH, then MH again"]
        return [note + "; consider loss.warmup_sh_steps or loss.stall_fallback=true"]

    def phase(self, epoch: int) -> str:
        """ "SH" (all negatives) or "MH" (hardest negative): the loss scale differs by about the batch size."""
        return "MH" if self.hardest(epoch) else "SH"

    def epoch_metrics(self, epoch: int) -> dict[str, Any]:
        return {"loss/hardest": int(self.hardest(epoch))}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "fallback_epochs": list(self.fallback_epochs)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.fallback_epochs = list(state["fallback_epochs"])
