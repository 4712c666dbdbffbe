"""Byte-level training data: the corpus, and each rank's deterministic, resumable batches.

The corpus is a flat array of bytes, cut into non-overlapping windows of `seq_len + 1`
bytes. Every epoch the windows are shuffled by a generator seeded with (seed, epoch) and dealt
round-robin to the ranks, so each rank reads only its own shard, all ranks take the same
number of batches per epoch, and the position in the data is one small cursor
(epoch, batch index) that a checkpoint can hold. The last windows are held out (`split_windows`):
never trained on, they measure the eval loss.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

# Source folders of the standard library left out of the default corpus: tests, GUI demos and
# vendored code add bulk without adding variety.
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "turtledemo",
              "lib2to3", "ensurepip", "__pycache__"}
_DEFAULT_CORPUS_BYTES = 16 << 20
# The share of windows held out for the eval loss (at least one window).
HELDOUT_SHARE = 0.05
# Data up to this size is hashed whole; above it, FINGERPRINT_SAMPLES evenly spaced slices.
FINGERPRINT_FULL_BYTES = 64 << 20
FINGERPRINT_SAMPLES, FINGERPRINT_SAMPLE_BYTES = 256, 64 << 10
_TEXT_SUFFIXES = {".txt", ".md", ".rst", ".py", ".json", ".toml", ".csv", ".html", ".xml", ".c",
                  ".h", ".sh", ".yaml", ".yml", ".tex", ".js", ".ts", ".go", ".rs", ".java"}


def stdlib_corpus(limit: int = _DEFAULT_CORPUS_BYTES) -> torch.Tensor:
    """The default corpus: the Python standard library's own source, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return _as_tensor(b"".join(_read_all(_walk(root, {".py"}), limit)))


def load_corpus(path: str | None) -> torch.Tensor:
    """All bytes of a text file (memory-mapped), of a folder's text files, or the default corpus.

    Only torch and the standard library: the nodes' venvs hold torch and little else.
    """
    if path is None:
        return stdlib_corpus()
    p = Path(path)
    if p.is_file():
        size = p.stat().st_size
        if size == 0:
            raise ValueError(f"--data {path}: the file is empty")
        # A private mapping: pages load as rank's windows touch them, nothing is copied.
        return torch.from_file(str(p), shared=False, size=size, dtype=torch.uint8)
    files = _walk(p, _TEXT_SUFFIXES)
    if not files:
        raise ValueError(f"--data {path}: no text files in that folder")
    return _as_tensor(b"".join(_read_all(files, limit=None)))


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
        torch.empty(0, dtype=torch.uint8)


def _walk(root: Path, suffixes: set[str]) -> list[Path]:
    # Sorted at every level so every node assembles the same bytes in the same order.
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        found += [Path(folder, n) for n in sorted(names) if Path(n).suffix in suffixes]
    return found


def _read_all(files: list[Path], limit: int | None) -> list[bytes]:
    parts, total = [], 0
    for f in files:
        parts.append(f.read_bytes())
        total += len(parts[-1])
        if limit is not None and total >= limit:
            break
    return parts


@dataclass
class DataCursor:
    """Where a rank's data stream stands: the next batch is batch `index` of epoch `epoch`."""

    epoch: int = 0
    index: int = 0

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}


class ShardedBatches:
    """One rank's stream of (input, target) batches of shape (batch_size, seq_len)."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, batch_size: int, rank: int,
                 world_size: int, seed: int, cursor: DataCursor | None = None):
        self.tokens, self.seq_len, self.batch_size = tokens, seq_len, batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.cursor = cursor or DataCursor()
        n_windows, _ = split_windows((len(tokens) - 1) // seq_len)
        # Equal shares per rank, so every rank reaches the end of an epoch at the same step.
        self.batches_per_epoch = n_windows // world_size // batch_size
        if self.batches_per_epoch < 1:
            raise ValueError(
                f"corpus of {len(tokens)} bytes is too small for {world_size} rank(s) x "
                f"batch {batch_size} x seq_len {seq_len}")
        self._n_windows = n_windows
        self._order_epoch, self._order = -1, torch.empty(0, dtype=torch.long)
        self._offsets = torch.arange(seq_len + 1)

    def _shard(self, epoch: int) -> torch.Tensor:
        if epoch != self._order_epoch:
            # hash() of a tuple of ints is stable across processes (no hash randomisation).
            g = torch.Generator().manual_seed(hash((self.seed, epoch)) % (1 << 63))
            perm = torch.randperm(self._n_windows, generator=g)
            take = self.batches_per_epoch * self.batch_size
            self._order, self._order_epoch = perm[self.rank::self.world_size][:take], epoch
        return self._order

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cursor
        rows = self._shard(c.epoch)[c.index * self.batch_size:(c.index + 1) * self.batch_size]
        chunk = self.tokens[rows[:, None] * self.seq_len + self._offsets].long()
        c.index += 1
        if c.index == self.batches_per_epoch:
            c.epoch, c.index = c.epoch + 1, 0
        return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def split_windows(n_windows: int) -> tuple[int, range]:
    """(training windows, held-out windows) of a corpus of `n_windows` windows.

    The last HELDOUT_SHARE (at least one) are held out and never trained on. One window between
    them is used by neither: neighbouring windows share their edge byte (the last target of one
    is the first input of the next), so the gap keeps every held-out byte out of training.
    """
    held = max(1, int(n_windows * HELDOUT_SHARE))
    return max(0, n_windows - held - 1), range(max(0, n_windows - held), n_windows)


def fingerprint(tokens: torch.Tensor) -> str:
    """sha256 of the data's dtype, length and content: all of it up to FINGERPRINT_FULL_BYTES,
    else FINGERPRINT_SAMPLES evenly spaced slices (the last one at the very end)."""
    flat = tokens.reshape(-1).contiguous()
    nbytes = flat.numel() * flat.element_size()
    h = hashlib.sha256(f"{flat.dtype} {flat.numel()}".encode())
    # The tensor's memory read in place (torch alone: no numpy to make a buffer of it).
    raw = (ctypes.c_char * nbytes).from_address(flat.data_ptr()) if nbytes else b""
    view = memoryview(raw).cast("B")
    if nbytes <= FINGERPRINT_FULL_BYTES:
        h.update(view)
    else:
        last = nbytes - FINGERPRINT_SAMPLE_BYTES
        for i in range(FINGERPRINT_SAMPLES):
            start = last * i // (FINGERPRINT_SAMPLES - 1)
            h.update(view[start:start + FINGERPRINT_SAMPLE_BYTES])
    return h.hexdigest()
