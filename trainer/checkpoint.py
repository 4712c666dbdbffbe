"""Checkpoints: atomic writes by rank 0, the last two kept, and one agreed checkpoint to resume.

A checkpoint is one `torch.save` file, `checkpoints/step-00000050.pt`, written to a temporary
name, fsynced, renamed, and the folder fsynced: a crash leaves either the old set or the new
one, never a torn file. It holds only tensors and plain values, so it loads with
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


def save_checkpoint(folder: Path, step: int, payload: dict, keep: int = KEEP) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(folder, step)
    tmp = folder / f".{final.name}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    if os.environ.get(PAUSE_ENV):
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
