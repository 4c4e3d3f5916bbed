"""Which epoch a streamed pass is for, told by the training workers to the Ray Data tasks that make the pass's
random views. A Ray Data plan is fixed when the dataset is built and every pass re-executes it, so a task cannot
learn its epoch from its arguments; the workers write it to Ray's cluster-wide key-value store (the GCS) before
they open the pass, and each task reads it when it runs. Every batch also carries the epoch its views were made
for, and the worker checks it, so a mix-up is an error, never silently wrong pixels."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

NAMESPACE = "raydist"
EPOCH_COLUMN = "epoch"


def _kv():
    # Ray's internal KV (ray.experimental.internal_kv) is the store Ray's own libraries use for this kind of small
    # cluster-wide state; every connected process (driver, Train worker, Ray Data task) has it, and no extra
    # actor process is needed. It is private API: a Ray without it fails here with the reason.
    from ray.experimental import internal_kv

    if not internal_kv._internal_kv_initialized():
        raise RuntimeError(
            "the epoch of a streamed pass needs a connected Ray process (ray.init or a Ray worker)"
        )
    return internal_kv


@dataclass(frozen=True)
class EpochBoard:
    """One streamed split's current epoch in Ray's key-value store, under a key of its own (``token``)."""

    token: str

    @classmethod
    def new(cls) -> EpochBoard:
        """A board with a fresh key (one per Ray Data dataset of a run)."""
        return cls(uuid.uuid4().hex)

    @property
    def key(self) -> str:
        return f"stream-epoch/{self.token}"

    def announce(self, epoch: int) -> None:
        """Say that the next pass over this split is for ``epoch`` (every worker does, before it opens the pass)."""
        _kv()._internal_kv_put(self.key, str(int(epoch)), overwrite=True, namespace=NAMESPACE)

    def current(self) -> int:
        """The epoch last announced (read by each Ray Data task of the pass)."""
        value = _kv()._internal_kv_get(self.key, namespace=NAMESPACE)
        if value is None:
            raise RuntimeError(
                f"no epoch announced for stream {self.token}: the split's passes must be opened by "
                "raydist.data.stream.StreamedEpochs (or EpochBoard.announce) before they run"
            )
        return int(value)
