"""Training data: the corpus (token shards or text as bytes), and each rank's resumable batches.

The corpus is one or more flat arrays of tokens (`shards.py`: nanoGPT's and llm.c's `.bin`;
any other text is read as bytes, one token per byte), cut into non-overlapping windows of
`seq_len + 1` tokens that never cross a shard's end. Every epoch the windows are shuffled by a
generator seeded with (seed, epoch) and dealt round-robin to the ranks, so each rank reads only
its own windows, all ranks take the same number of batches per epoch, and the position in the
data is one small cursor (epoch, batch index) that a checkpoint can hold. Without a validation
split the last windows are held out (`split_windows`): never trained on, they measure the eval
loss.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from .collectives import all_gather_objects
from .config import TrainConfig
from .gptconfig import default_seq_len
from .shards import (
    GPT2_VOCAB,
    DataError,
    Shard,
    byte_shard,
    first_bad_id,
    is_token_file,
    is_val_file,
    listed_only,
    open_token_files,
)

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
            raise DataError(f"--data {path}: the file is empty")
        # A private mapping: pages load as rank's windows touch them, nothing is copied.
        return torch.from_file(str(p), shared=False, size=size, dtype=torch.uint8)
    files = listed_only(p, text_files(p))
    if not files:
        raise DataError(f"--data {path}: no text files in that folder")
    return _as_tensor(b"".join(_read_all(files, limit=None)))


@dataclass(frozen=True)
class Corpus:
    """The data as shards of tokens, the vocabulary it declares and its format."""

    shards: list[Shard]
    vocab_size: int
    kind: str  # "bytes" (text), "nanoGPT" or "llm.c" (.bin token shards)

    def __len__(self) -> int:
        return sum(len(s) for s in self.shards)

    @property
    def gpt2_tokens(self) -> bool:
        return self.kind != "bytes" and self.vocab_size == GPT2_VOCAB

    def describe(self) -> dict:
        return {"format": self.kind, "shards": len(self.shards), "tokens": len(self),
                "vocab_size": self.vocab_size}

    def check_ids(self, rank: int = 0, world_size: int = 1) -> str | None:
        """This rank's share of the vocabulary check: an error line, or None (bytes: always)."""
        if self.kind == "bytes":
            return None
        return first_bad_id(self.shards, self.vocab_size, rank, world_size)


def open_splits(path: str | None) -> tuple[Corpus, Corpus | None]:
    """The training corpus at `path` and its validation split, when the data ships one.

    `.bin` files are token shards; the validation split is nanoGPT's `val.bin` or llm.c's
    `*_val_*.bin` beside the training shards (None when there is none: the caller holds out
    windows instead). Anything else is text, read as bytes, without a split.
    """
    p = Path(path) if path is not None else None
    if p is not None and p.is_file() and is_token_file(p):
        siblings = sorted(f for f in p.parent.glob("*.bin") if f.is_file() and is_val_file(f))
        train = [] if is_val_file(p) else [p]
        return _tokens(train or [p]), _tokens(siblings) if train else None
    if p is not None and p.is_dir():
        bins = listed_only(p, sorted(f for f in p.glob("*.bin") if f.is_file()))
        if bins:
            train = [f for f in bins if not is_val_file(f)]
            val = [f for f in bins if is_val_file(f)]
            if not train:
                raise DataError(f"--data {path}: only validation shards ({val[0].name}) there")
            return _tokens(train), _tokens(val)
    return Corpus([byte_shard(str(path), load_corpus(path))], 256, "bytes"), None


def load_data(cfg: TrainConfig) -> tuple[TrainConfig, tuple[Corpus, Corpus | None]]:
    """The run's data (train, validation) and `cfg` with its seq_len resolved: unset, it is
    the preset's context on this data (gptconfig.default_seq_len)."""
    train, val = open_splits(cfg.data)
    if val is not None and (val.kind, val.vocab_size) != (train.kind, train.vocab_size):
        raise DataError(f"--data {cfg.data}: validation shards ({val.kind}, {val.vocab_size} ids) "
                        f"differ from training shards ({train.kind}, {train.vocab_size} ids)")
    seq_len = cfg.seq_len or default_seq_len(cfg.preset, train.gpt2_tokens)
    return dataclasses.replace(cfg, seq_len=seq_len), (train, val)


def check_token_ids(splits: tuple[Corpus, Corpus | None], rank: int, world_size: int,
                    device: torch.device) -> None:
    """Collective: each rank scans its share of the data for ids past the vocabulary; every
    rank then raises the same one-line error, so none is left waiting in a collective."""
    mine = [c.check_ids(rank, world_size) for c in splits if c is not None]
    found = [e for errors in all_gather_objects(mine, device) for e in errors if e]
    if found:
        raise DataError(found[0])


def describe_data(train: Corpus, val: Corpus | None, seq_len: int) -> dict:
    """What the run trains on, for the log and summary.json."""
    return {**train.describe(), "seq_len": seq_len, "val": val.describe() if val else None}


def _tokens(files: list[Path]) -> Corpus | None:
    if not files:
        return None
    return Corpus(*open_token_files(files))


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
        torch.empty(0, dtype=torch.uint8)


def text_files(root: Path) -> list[Path]:
    """A folder's text files, in the order every node reads them."""
    return _walk(root, _TEXT_SUFFIXES)


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


class Windows:
    """A corpus cut into windows of `seq_len + 1` tokens that never cross a shard's end."""

    def __init__(self, corpus: Corpus, seq_len: int):
        self.corpus, self.seq_len = corpus, seq_len
        # Window w of the whole corpus is window w - _first[k] of shard k.
        per_shard = torch.tensor([max(0, (len(s) - 1) // seq_len) for s in corpus.shards])
        self._first = torch.cumsum(per_shard, 0) - per_shard
        self.count = int(per_shard.sum())

    def window(self, w: int) -> torch.Tensor:
        """Window `w` of the whole corpus: its `seq_len + 1` tokens, as int64 ids."""
        k = int(torch.searchsorted(self._first, w, right=True)) - 1
        shard = self.corpus.shards[k]
        return shard.read((w - int(self._first[k])) * self.seq_len, self.seq_len + 1)


class ShardedBatches:
    """One rank's stream of (input, target) batches of shape (batch_size, seq_len).

    `holdout`: train on the windows `split_windows` leaves for training (the data has no
    validation split); False trains on every window.
    """

    def __init__(self, tokens: torch.Tensor | Corpus, seq_len: int, batch_size: int, rank: int,
                 world_size: int, seed: int, cursor: DataCursor | None = None,
                 holdout: bool = True):
        if isinstance(tokens, torch.Tensor):
            tokens = Corpus([byte_shard("tokens", tokens)], 256, "bytes")
        self.corpus, self.seq_len, self.batch_size = tokens, seq_len, batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.cursor = cursor or DataCursor()
        self.windows = Windows(tokens, seq_len)
        n_windows = split_windows(self.windows.count)[0] if holdout else self.windows.count
        # Equal shares per rank, so every rank reaches the end of an epoch at the same step.
        self.batches_per_epoch = n_windows // world_size // batch_size
        if self.batches_per_epoch < 1:
            unit = "bytes" if tokens.kind == "bytes" else "tokens"
            raise DataError(
                f"corpus of {len(tokens)} {unit} is too small for {world_size} rank(s) x "
                f"batch {batch_size} x seq_len {seq_len}")
        self.train_windows = n_windows
        self._order_epoch, self._order = -1, torch.empty(0, dtype=torch.long)

    def _shard(self, epoch: int) -> torch.Tensor:
        if epoch != self._order_epoch:
            # hash() of a tuple of ints is stable across processes (no hash randomisation).
            g = torch.Generator().manual_seed(hash((self.seed, epoch)) % (1 << 63))
            perm = torch.randperm(self.train_windows, generator=g)
            take = self.batches_per_epoch * self.batch_size
            self._order, self._order_epoch = perm[self.rank::self.world_size][:take], epoch
        return self._order

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cursor
        batch = self._batch(c.epoch, c.index)
        c.index += 1
        if c.index == self.batches_per_epoch:
            c.epoch, c.index = c.epoch + 1, 0
        return batch

    def batch_at(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch `n` of the stream (from 0, across epochs); the cursor is not moved (live runs)."""
        return self._batch(*divmod(n, self.batches_per_epoch))

    def _batch(self, epoch: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self._shard(epoch)[index * self.batch_size:(index + 1) * self.batch_size]
        chunk = torch.stack([self.windows.window(int(w)) for w in rows])
        return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def split_windows(n_windows: int) -> tuple[int, range]:
    """(training windows, held-out windows) of a corpus of `n_windows` windows.

    The last HELDOUT_SHARE (at least one) are held out and never trained on. One window between
    them is used by neither: neighbouring windows share their edge token (the last target of one
    is the first input of the next), so the gap keeps every held-out token out of training.
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
