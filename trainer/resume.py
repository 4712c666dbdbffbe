"""What a checkpoint's data cursor means, and the rule that carries it to a resumed run.

A cursor (epoch, batch index) only means something for one layout of the data: the corpus, its
cut into windows (seq_len), the seed that shuffles every epoch, and how the shuffled windows are
dealt (world size x micro-batch). The checkpoint records that layout (`data_layout`,
docs/ARCHITECTURE.md, "The checkpoint contract"); a resume under another one either remaps the
cursor exactly or refuses, never restores it as is (a cursor past the new epoch's end gives
empty batches and a NaN loss on every replica).

The rule. Every epoch the training windows are shuffled by (seed, epoch) alone and dealt
round-robin, so after `index` batches on every rank the windows consumed are exactly the first
index x batch_size x world_size of the epoch's order, whatever the layout. With the same corpus,
seq_len and seed (the same order), the position is that count; the new cursor is the first
batch boundary at or after it, ceil(consumed / (new world_size x new batch_size)); the windows
in between (fewer than one global batch) are skipped for this epoch, never trained twice. A
boundary at or past the new epoch's end starts the next epoch. grad_accum does not enter: the
cursor counts micro-batches. Another corpus, seq_len or seed is another order: refused, and so
is a checkpoint that records no layout.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .config import ConfigError, TrainConfig
from .data import DataCursor

# Changing one of these changes which windows exist or their order: the position is lost.
_ORDER_KEYS = {"fingerprint": "corpus fingerprint", "seq_len": "seq_len", "seed": "seed",
               "windows": "training windows"}
# Changing one of these only changes how the same order is dealt: the position is remapped.
_DEAL_KEYS = ("world_size", "batch_size", "grad_accum")


class ResumeRefused(ConfigError):
    """A checkpoint whose data position cannot be carried to this run's data layout."""


@dataclass(frozen=True)
class DataLayout:
    """How this run reads its data; with a cursor, what the cursor means."""

    windows: int  # training windows per epoch's order (the held-out ones excluded)
    world_size: int
    batch_size: int  # micro-batch per rank, in windows
    seq_len: int
    grad_accum: int
    seed: int
    fingerprint: str  # data.fingerprint of the corpus, the same on every rank (datacheck)
    data_bytes: int  # the corpus's size in bytes

    @classmethod
    def of(cls, cfg: TrainConfig, world_size: int, windows: int, fingerprint: str,
           data_bytes: int) -> DataLayout:
        return cls(windows, world_size, cfg.batch_size, cfg.seq_len, cfg.grad_accum, cfg.seed,
                   fingerprint, data_bytes)

    def record(self, cursor: DataCursor) -> dict:
        """The checkpoint's `data_layout`: this layout and the position of `cursor` in it."""
        return {**asdict(self), "epoch": cursor.epoch,
                "windows_consumed": cursor.index * self.batch_size * self.world_size}

    @property
    def batches_per_epoch(self) -> int:
        return self.windows // self.world_size // self.batch_size


def resume_cursor(ckpt: dict | None, now: DataLayout) -> tuple[DataCursor, str | None]:
    """The cursor to continue from, and a line saying how it was remapped (None: restored as
    saved). Raises ResumeRefused naming what changed when the position cannot be carried over."""
    if not ckpt:
        return DataCursor(), None
    old = ckpt.get("data_layout")
    if not old:
        raise ResumeRefused(
            f"cannot resume step {ckpt['step']}: the checkpoint records no data layout (an older "
            f"fatpipe wrote it), so its position in the data cannot be checked; start a new run "
            f"(another --out)")
    changed = [_fingerprints(old, now) if k == "fingerprint" else
               f"{label} {old[k]} -> {getattr(now, k)}"
               for k, label in _ORDER_KEYS.items() if old[k] != getattr(now, k)]
    if changed:
        raise ResumeRefused(
            f"cannot resume step {ckpt['step']}: {'; '.join(changed)}: the data's order is not "
            f"the checkpoint's, so its position in the data is lost; resume with the "
            f"checkpoint's data and settings, or start a new run (another --out)")
    dealt = [f"{k} {old[k]} -> {getattr(now, k)}" for k in _DEAL_KEYS if old[k] != getattr(now, k)]
    if not dealt:
        return DataCursor(**ckpt["data_cursor"]), None
    epoch, consumed = old["epoch"], old["windows_consumed"]
    per_batch = now.world_size * now.batch_size
    index = math.ceil(consumed / per_batch)
    skipped = index * per_batch - consumed
    if index >= now.batches_per_epoch:  # the boundary lies at or past this epoch's end
        skipped = max(0, now.batches_per_epoch * per_batch - consumed)
        epoch, index = epoch + 1, 0
    line = (f"data cursor remapped ({', '.join(dealt)}): {consumed} windows of epoch "
            f"{old['epoch']} consumed -> epoch {epoch} batch {index} of "
            f"{now.batches_per_epoch}, {skipped} window(s) skipped")
    return DataCursor(epoch, index), line


def _fingerprints(old: dict, now: DataLayout) -> str:
    return (f"corpus fingerprint {old['fingerprint'][:12]} ({old['data_bytes']} bytes) -> "
            f"{now.fingerprint[:12]} ({now.data_bytes} bytes)")
