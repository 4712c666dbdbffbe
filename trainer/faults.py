"""Counted faults: the collectives a run attempted and the ones that failed, over every attempt.

Every collective the trainer issues (a DDP bucket's gradient sync, an object broadcast or
gather, a timed all-reduce) adds one to `ISSUED`. A worker dies at the first collective that
raises or times out, so its counts are kept outside it, in the run-wide store that torchrun's
agent keeps across restarts: rank 0 adds what it issued to `issued/<attempt>` as it goes, and
any rank that sees a collective fail sets `failed/<attempt>`. Rank 0 adds those up at the start
of each attempt, and keeps the totals of this torchrun (one store, one nonce) in the run
folder's faults.json, so a run started again in the same folder goes on counting.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import torch.distributed as dist

from .distenv import STORE_PREFIX
from .files import write_text_atomic

log = logging.getLogger(__name__)

FAULTS_FILE = "faults.json"
# What a failed collective raises: torch's own distributed errors, or gloo/NCCL's RuntimeError.
_COLLECTIVE_WORDS = ("gloo", "nccl", "connection", "timed out", "timeout", "peer", "socket")


class _Issued:
    """Collectives this process has issued (a plain counter: one training process, one thread)."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, n: int = 1) -> None:
        self.count += n


ISSUED = _Issued()


def is_collective_failure(error: BaseException) -> bool:
    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(w in text for w in _COLLECTIVE_WORDS)


class FaultLedger:
    """This run's fault counts; rank 0 keeps them, every rank reports a failure it sees."""

    def __init__(self, run_dir: Path, store: dist.Store, attempt: int, is_main: bool):
        self.path = Path(run_dir) / FAULTS_FILE
        self.store, self.attempt, self.is_main = store, attempt, is_main
        self.pushed = ISSUED.count  # what rank 0 has added to the store so far
        self.failed_here = False
        # This torchrun's id, so a run started again in the folder adds to the counts of the
        # one before instead of overwriting them.
        self.nonce = self._call(lambda: store.compare_set(
            f"{STORE_PREFIX}/run-nonce", "", uuid.uuid4().hex), b"").decode() or "unknown"
        self.before = {"attempted": 0, "failed": 0}  # earlier torchruns in this folder
        self.earlier = {"attempted": 0, "failed": 0}  # this torchrun's earlier attempts
        if is_main:
            self._load()

    def _key(self, what: str, attempt: int) -> str:
        return f"{STORE_PREFIX}/{what}/{attempt}"

    def _call(self, fn, default):
        """A store call whose failure is logged, not raised: the store may be gone with its node
        (a call on a store that stopped answering fails after the group's timeout)."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - counting must never be what fails the run
            log.warning("fault counts: the store did not answer (%s)", e)
            return default

    def _load(self) -> None:
        runs = _read(self.path).get("runs", {})
        for nonce, counts in runs.items():
            if nonce != self.nonce:
                for k in self.before:
                    self.before[k] += int(counts.get(k, 0))
        for a in range(1, self.attempt):
            self.earlier["attempted"] += self._call(
                lambda a=a: self.store.add(self._key("issued", a), 0), 0)
            if self._call(lambda a=a: self.store.check([self._key("failed", a)]), False):
                self.earlier["failed"] += 1

    def push(self) -> None:
        """Rank 0: add the collectives issued since the last push to this attempt's count."""
        if self.is_main and ISSUED.count > self.pushed:
            delta, self.pushed = ISSUED.count - self.pushed, ISSUED.count
            self._call(lambda: self.store.add(self._key("issued", self.attempt), delta), 0)

    def record_failure(self, error: BaseException) -> None:
        """A collective raised or timed out on this rank: mark this attempt as failed."""
        self.failed_here = True
        log.warning("collective failed in attempt %d: %s", self.attempt,
                    str(error).splitlines()[0] if str(error) else type(error).__name__)
        self.push()
        self._call(lambda: self.store.set(self._key("failed", self.attempt), "1"), None)
        if self.is_main:
            self.save()

    def totals(self) -> dict:
        """This run's counts so far, every attempt and every torchrun in the folder."""
        attempted = self.before["attempted"] + self.earlier["attempted"] + ISSUED.count
        failed = self.before["failed"] + self.earlier["failed"] + int(self.failed_here)
        return {"collectives_attempted": attempted, "failed_collectives": failed,
                "sync_failure_rate": failed / attempted if attempted else 0.0}

    def save(self) -> None:
        """Rank 0: write this torchrun's counts into faults.json (beside the earlier ones)."""
        if not self.is_main:
            return
        doc = _read(self.path)
        runs = doc.get("runs", {})
        runs[self.nonce] = {"attempted": self.earlier["attempted"] + ISSUED.count,
                            "failed": self.earlier["failed"] + int(self.failed_here),
                            "attempts": self.attempt}
        write_text_atomic(self.path, json.dumps({"runs": runs, **self.totals()}, indent=2) + "\n")


def _read(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
