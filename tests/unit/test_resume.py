"""The data cursor on resume: the checkpoint's data_layout, the remap rule, the refusals, and
the data's fingerprint and held-out split."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fatpipe.trainer.config import ConfigError, TrainConfig
from fatpipe.trainer.data import DataCursor, ShardedBatches, fingerprint, split_windows
from fatpipe.trainer.resume import DataLayout, ResumeRefused, resume_cursor

pytestmark = pytest.mark.timeout(60)

SEQ = 8


def _layout(world: int = 2, batch: int = 4, windows: int = 800, **kw) -> DataLayout:
    cfg = TrainConfig(batch_size=batch, seq_len=kw.pop("seq_len", SEQ), seed=kw.pop("seed", 1),
                      grad_accum=kw.pop("grad_accum", 1))
    return dataclasses.replace(DataLayout.of(cfg, world, windows, "f" * 64, 12_345), **kw)


def _ckpt(layout: DataLayout, cursor: DataCursor, step: int = 50) -> dict:
    return {"step": step, "data_cursor": cursor.to_dict(), "data_layout": layout.record(cursor)}


def _consumed(tokens, layout: DataLayout, cursor: DataCursor) -> set[int]:
    """The windows every rank of `layout` has read in the cursor's epoch, before the cursor."""
    seen = set()
    for rank in range(layout.world_size):
        b = ShardedBatches(tokens, layout.seq_len, layout.batch_size, rank, layout.world_size,
                           layout.seed)
        seen |= set(b._shard(cursor.epoch)[:cursor.index * layout.batch_size].tolist())
    return seen


def test_the_same_layout_restores_the_cursor_as_saved():
    layout = _layout()
    assert resume_cursor(_ckpt(layout, DataCursor(3, 17)), layout) == (DataCursor(3, 17), None)
    assert resume_cursor(None, layout) == (DataCursor(), None)


def test_another_world_size_resumes_at_the_windows_consumed_and_says_what_it_skipped():
    old, new = _layout(world=2), _layout(world=3)
    cursor, line = resume_cursor(_ckpt(old, DataCursor(1, 10)), new)
    # 10 batches x 4 x 2 ranks = 80 windows; 3 ranks x 4 = 12 per batch: batch 7 (84), 4 skipped.
    assert cursor == DataCursor(1, 7)
    assert line == ("data cursor remapped (world_size 2 -> 3): 80 windows of epoch 1 consumed "
                    "-> epoch 1 batch 7 of 66, 4 window(s) skipped")
    exact, line = resume_cursor(_ckpt(old, DataCursor(0, 12)), _layout(world=4, batch=2))
    assert exact == DataCursor(0, 12) and "0 window(s) skipped" in line


def test_the_remapped_position_is_exactly_the_windows_the_old_layout_read():
    """Real shards: what the old layout read is a prefix of the epoch's order, and the new
    layout reads every other window of the epoch, none twice, bar the skipped ones."""
    tokens = torch.arange(2000 * SEQ + 1, dtype=torch.uint8)
    windows, _ = split_windows(2000)
    old, new = _layout(world=2, batch=4, windows=windows), _layout(world=3, batch=5, windows=windows)
    saved = DataCursor(2, 33)
    cursor, line = resume_cursor(_ckpt(old, saved), new)
    before = _consumed(tokens, old, saved)
    ahead = _consumed(tokens, new, DataCursor(2, new.batches_per_epoch)) - _consumed(tokens, new,
                                                                                     cursor)
    assert len(before) == 33 * 4 * 2 and not before & ahead
    skipped = _consumed(tokens, new, cursor) - before
    assert len(skipped) == int(line.split(", ")[-1].split()[0]) < new.world_size * new.batch_size


def test_a_cursor_past_the_new_epochs_end_starts_the_next_epoch():
    """The reproduction: batch 195 restored into an epoch of 98 gave empty batches and NaN."""
    old = _layout(world=1, batch=4, windows=790)
    new = _layout(world=2, batch=4, windows=790)
    assert (old.batches_per_epoch, new.batches_per_epoch) == (197, 98)
    cursor, line = resume_cursor(_ckpt(old, DataCursor(0, 195)), new)
    # 780 windows read; batch 98 (784) is the end of the new epoch: the next one, 4 skipped.
    assert cursor == DataCursor(1, 0)
    assert "780 windows of epoch 0 consumed -> epoch 1 batch 0 of 98, 4 window(s) skipped" in line


def test_batch_and_accumulation_changes_are_remapped():
    old = _layout()
    cursor, line = resume_cursor(_ckpt(old, DataCursor(0, 6)), _layout(batch=3, grad_accum=2))
    assert cursor == DataCursor(0, 8) and "batch_size 4 -> 3, grad_accum 1 -> 2" in line
    # grad_accum alone: the cursor counts micro-batches, so the position is the same batch.
    same, line = resume_cursor(_ckpt(old, DataCursor(0, 6)), _layout(grad_accum=4))
    assert same == DataCursor(0, 6) and "0 window(s) skipped" in line


@pytest.mark.parametrize(("change", "named"), [
    ({"seq_len": 16, "windows": 400}, "seq_len 8 -> 16"),
    ({"fingerprint": "e" * 64, "data_bytes": 999}, "corpus fingerprint ffffffffffff (12345 "
                                                   "bytes) -> eeeeeeeeeeee (999 bytes)"),
    ({"seed": 2}, "seed 1 -> 2"),
    ({"windows": 700}, "training windows 800 -> 700"),
])
def test_a_resume_that_changes_the_datas_order_is_refused_naming_the_change(change, named):
    old = _layout()
    with pytest.raises(ResumeRefused) as e:
        resume_cursor(_ckpt(old, DataCursor(0, 5)), dataclasses.replace(old, **change))
    msg = str(e.value)
    assert named in msg and "cannot resume step 50" in msg and "\n" not in msg
    assert isinstance(e.value, ConfigError)  # the entry point's one-line error, exit 2


def test_a_checkpoint_without_a_layout_is_refused():
    with pytest.raises(ResumeRefused, match="records no data layout"):
        resume_cursor({"step": 10, "data_cursor": {"epoch": 0, "index": 3}}, _layout())


def test_the_layout_records_the_windows_consumed():
    rec = _layout(world=3, batch=5).record(DataCursor(2, 7))
    assert rec["epoch"] == 2 and rec["windows_consumed"] == 7 * 5 * 3
    assert {"windows", "world_size", "batch_size", "seq_len", "grad_accum", "seed",
            "fingerprint", "data_bytes"} <= set(rec)


def test_fingerprint_sees_one_changed_byte_and_samples_large_data(monkeypatch):
    data = torch.randint(0, 256, (100_000,), dtype=torch.uint8)
    changed = data.clone()
    changed[50_000] += 1
    assert fingerprint(data) == fingerprint(data.clone()) != fingerprint(changed)
    assert fingerprint(data) != fingerprint(data[:-1]) != fingerprint(data.to(torch.int16))
    import fatpipe.trainer.data as data_module

    monkeypatch.setattr(data_module, "FINGERPRINT_FULL_BYTES", 1000)
    monkeypatch.setattr(data_module, "FINGERPRINT_SAMPLE_BYTES", 16)
    tail = data.clone()
    tail[-1] += 1
    assert fingerprint(data) != fingerprint(tail)  # the last sample ends at the very end


def test_held_out_windows_are_never_trained_on():
    n = 1000
    train, held = split_windows(n)
    assert (train, held) == (949, range(950, 1000))  # 5%, one window of gap
    tokens = torch.zeros(n * SEQ + 1, dtype=torch.uint8)
    read = set()
    for rank in range(2):
        b = ShardedBatches(tokens, SEQ, 4, rank, 2, seed=3)
        read |= set(b._shard(0).tolist()) | set(b._shard(1).tolist())
    assert max(read) < held.start - 1  # a window's last byte is the next one's first
    assert split_windows(10) == (8, range(9, 10))
