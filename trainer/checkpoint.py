"""Checkpoints: atomic writes, the last two kept, and one agreed checkpoint to resume.

A checkpoint is a shared part, `checkpoints/step-00000050.pt` (model, optimizer, data cursor,
comm decision), written by rank 0, and each rank's own part, `checkpoints/rank-R/step-...pt`
(its RNG, PowerSGD error feedback, a periodic method's replica), written by that rank on its
own node's disk: the per-rank state never crosses the (slow) link, and the shared part stays
the same size whatever the number of ranks. Every file is written to a temporary name,
fsynced, renamed, and its folder fsynced: a crash leaves either the old set or the new one,
never a torn file. Files hold only tensors and plain values, so they load with
`weights_only=True`.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path

import torch
import torch.distributed as dist

from .collectives import all_gather_objects, broadcast_object

log = logging.getLogger(__name__)

KEEP = 2
# For fault tests only: seconds to wait with the temporary file written and not yet renamed, so
# a test can kill the writer inside that window.
PAUSE_ENV = "FATPIPE_TEST_CHECKPOINT_PAUSE_S"
_NAME = re.compile(r"^step-(\d{8})\.pt$")


def checkpoint_path(folder: Path, step: int) -> Path:
    return folder / f"step-{step:08d}.pt"


def list_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint in `folder`, oldest first."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), folder / m.group(0))
             for m in map(_NAME.match, os.listdir(folder)) if m]
    return sorted(found)


def rank_folder(folder: Path, rank: int) -> Path:
    """Where `rank` keeps its own part of every checkpoint in `folder`."""
    return folder / f"rank-{rank}"


def save_checkpoint(folder: Path, step: int, payload: dict, keep: int = KEEP,
                    test_pause: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(folder, step)
    tmp = folder / f".{final.name}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    if test_pause and os.environ.get(PAUSE_ENV):
        time.sleep(float(os.environ[PAUSE_ENV]))
    os.replace(tmp, final)
    _fsync_dir(folder)
    for _, old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    for stale in folder.glob(".step-*.pt.tmp-*"):  # left by an attempt killed mid-write
        if stale != tmp:
            stale.unlink(missing_ok=True)
    return final


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def load_agreed_checkpoint(folder: Path, device: torch.device) -> dict | None:
    """The latest checkpoint of rank 0, on every rank (collective).

    Every rank reads the file itself when it can see it (shared folder, or a single node);
    if any rank cannot (a multi-node run on local disks), rank 0 broadcasts its copy.
    """
    mine = list_checkpoints(folder)
    step = broadcast_object(mine[-1][0] if mine else -1, 0, device)
    if step < 0:
        return None
    path = checkpoint_path(folder, step)
    if all(all_gather_objects(path.is_file(), device)):
        payload = load_checkpoint(path)
    else:
        log.info("checkpoint step %d missing on some ranks: broadcasting rank 0's copy", step)
        payload = broadcast_object(load_checkpoint(path) if dist.get_rank() == 0 else None, 0,
                                   device)
    log.info("resuming from %s", path)
    return payload


def load_rank_state(folder: Path, ckpt: dict | None, device: torch.device) -> dict | None:
    """Collective: this rank's own part of the agreed checkpoint `ckpt`; None on every rank
    when any rank lacks its part (a replaced node's disk, another number of ranks), so that
    all of them start their per-rank state fresh together."""
    if not ckpt:
        return None
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if ckpt.get("world_size") != world_size:
        log.warning("checkpoint from %s ranks, now %d: per-rank RNG and PowerSGD error feedback "
                    "start fresh", ckpt.get("world_size"), world_size)
        return None
    path = checkpoint_path(rank_folder(folder, rank), ckpt["step"])
    mine = load_checkpoint(path) if path.is_file() else None
    missing = [r for r, ok in enumerate(all_gather_objects(mine is not None, device)) if not ok]
    if missing:
        log.warning("checkpoint step %d: rank(s) %s lack their own part (%s): per-rank RNG and "
                    "PowerSGD error feedback start fresh on every rank", ckpt["step"], missing,
                    rank_folder(folder, missing[0]))
        return None
    return mine
