"""Counted faults: the collectives a run attempted and the ones that failed, over every attempt.

Every collective the trainer issues (a DDP bucket's gradient sync, an object broadcast or
gather, a timed all-reduce) adds one to `ISSUED`. A worker dies at the first collective that
raises or times out, so its counts are kept outside it, in the run-wide store that torchrun's
agent keeps across restarts: rank 0 adds what it issued to `issued/<attempt>` (at most once a
second, and at once when a collective fails), and any rank that sees a collective fail sets
`failed/<attempt>`. Rank 0 adds those up at the start of each attempt, and keeps the totals of
this torchrun (one store, one nonce) in the run folder's faults.json, so a run started again in
the same folder goes on counting.

Each failure is also described, for the one line `fatpipe launch` prints when a run fails: every
rank that sees it reports where it was (phase and step, from the traceback) to the store under its
rank, next to the node it runs on. The ranks that never report, or report only once their link is
back, are the ones cut off: their node lost its link, or their process died. Rank 0 writes the
failure, with those nodes, into faults.json as soon as it sees it (there may be no next attempt),
or, when it was the rank that died, at the start of the next attempt.
"""

from __future__ import annotations

import json
import logging
import socket
import time
import uuid
from pathlib import Path

import torch.distributed as dist

from fatpipe.node.env import NodeEnv

from .distenv import STORE_PREFIX
from .files import write_text_atomic

log = logging.getLogger(__name__)

FAULTS_FILE = "faults.json"  # infra.defaults keeps a copy for the launcher; a unit test ties them
REPORT_WAIT_S = 5.0  # how long rank 0 waits for the other ranks to report a failure
PUSH_EVERY_S = 1.0  # how often rank 0 adds its issued collectives to the store (a round trip)
# The Trainer's methods (fatpipe.trainer.train) a failure can happen in, and the phase each is.
PHASES = {"run": "training", "train_step": "training", "save": "checkpoint", "setup": "setup",
          "finish": "finish"}
TRAIN_MODULE = __name__.rpartition(".")[0] + ".train"
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


def failure_point(error: BaseException) -> tuple[str, int | None]:
    """(phase, step) where `error` was raised: the innermost Trainer method on its traceback, and
    the step it was at (train_step and save take one)."""
    phase, step, tb = "startup", None, error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_globals.get("__name__") == TRAIN_MODULE and frame.f_code.co_name in PHASES:
            phase, step = PHASES[frame.f_code.co_name], frame.f_locals.get("step")
        tb = tb.tb_next
    return phase, step if isinstance(step, int) else None


def short_error(error: BaseException) -> str:
    """The cause in one line: gloo wraps it in callback errors and prefixes its source file."""
    text = (str(error).splitlines() or [type(error).__name__])[0]
    text = text.rpartition("Got the following error when running the callback: ")[2]
    text = text.removeprefix("RuntimeError: ")
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text[:300]


def where(phase: str, step: int | None) -> str:
    return f"{phase} at step {step}" if step is not None else phase


class FaultLedger:
    """This run's fault counts; rank 0 keeps them, every rank reports a failure it sees."""

    def __init__(self, run_dir: Path, store: dist.Store, attempt: int, is_main: bool,
                 rank: int | None = None, world_size: int | None = None):
        self.path = Path(run_dir) / FAULTS_FILE
        self.store, self.attempt, self.is_main = store, attempt, is_main
        initialized = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else dist.get_rank() if initialized else 0
        self.world_size = (world_size if world_size is not None
                           else dist.get_world_size() if initialized else 1)
        self.node = NodeEnv.from_environ().node_name or socket.gethostname()
        self.failures: list[dict] = []  # described failures, every attempt and torchrun (rank 0)
        self.pushed = ISSUED.count  # what rank 0 has added to the store so far
        self.pushed_at = time.monotonic()
        self.failed_here = False
        self.store_answers = True  # False once a store call has failed
        # This torchrun's id, so a run started again in the folder adds to the counts of the
        # one before instead of overwriting them.
        self.nonce = self._call(lambda: store.compare_set(
            f"{STORE_PREFIX}/run-nonce", "", uuid.uuid4().hex), b"").decode() or "unknown"
        self.before = {"attempted": 0, "failed": 0}  # earlier torchruns in this folder
        self.earlier = {"attempted": 0, "failed": 0}  # this torchrun's earlier attempts
        self._call(lambda: store.set(self._rank_key("node", self.attempt, self.rank), self.node),
                   None)
        if is_main:
            self._load()

    def _key(self, what: str, attempt: int) -> str:
        return f"{STORE_PREFIX}/{what}/{attempt}"

    def _rank_key(self, what: str, attempt: int, rank: int) -> str:
        return f"{self._key(what, attempt)}/{rank}"

    def _call(self, fn, default):
        """A store call whose failure is logged, not raised: the store may be gone with its node
        (a call on a store that stopped answering fails after the group's timeout)."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - counting must never be what fails the run
            log.warning("fault counts: the store did not answer (%s)", e)
            self.store_answers = False
            return default

    def _load(self) -> None:
        doc = _read(self.path)
        self.failures = [f for f in doc.get("failures", []) if isinstance(f, dict)]
        runs = doc.get("runs", {})
        for nonce, counts in runs.items():
            if nonce != self.nonce:
                for k in self.before:
                    self.before[k] += int(counts.get(k, 0))
        for a in range(1, self.attempt):
            self.earlier["attempted"] += self._call(
                lambda a=a: self.store.add(self._key("issued", a), 0), 0)
            if self._call(lambda a=a: self.store.check([self._key("failed", a)]), False):
                self.earlier["failed"] += 1
                self._describe(a, wait_s=0)  # when the rank 0 that saw it died before writing it

    def push(self, now: bool = True) -> None:
        """Rank 0: add the collectives issued since the last push to this attempt's count.

        Called every step with `now=False`: at most every PUSH_EVERY_S, since each push is a
        store round trip. A failure pushes at once; a killed rank 0 loses at most that second.
        """
        if not now and time.monotonic() - self.pushed_at < PUSH_EVERY_S:
            return
        if self.is_main and ISSUED.count > self.pushed:
            delta, self.pushed = ISSUED.count - self.pushed, ISSUED.count
            self.pushed_at = time.monotonic()
            self._call(lambda: self.store.add(self._key("issued", self.attempt), delta), 0)

    def record_failure(self, error: BaseException, point: tuple[str, int | None] | None = None) -> None:
        """A collective raised or timed out on this rank: mark this attempt as failed. `point`
        is (phase, step) when the caller knows it (a script using trainer.api)."""
        self.failed_here = True
        phase, step = point or failure_point(error)
        log.warning("collective failed in %s (attempt %d) on %s: %s", where(phase, step),
                    self.attempt, self.node, short_error(error))
        started = time.monotonic()
        self.push()
        report = {"phase": phase, "step": step, "error": short_error(error)}
        key = self._rank_key("report", self.attempt, self.rank)
        self._call(lambda: self.store.set(key, json.dumps(report)), None)
        # set() only queues the request; a call the store answers tells when it has arrived.
        self._call(lambda: self.store.check([key]), False)
        late_s = time.monotonic() - started
        if late_s > REPORT_WAIT_S:  # the store was out of reach (our link was down): say so
            self._call(lambda: self.store.set(key, json.dumps({**report, "late_s": late_s})), None)
        self._call(lambda: self.store.set(self._key("failed", self.attempt), "1"), None)
        if self.is_main:
            self._describe(self.attempt, wait_s=REPORT_WAIT_S)
            self.save()

    def _describe(self, attempt: int, wait_s: float) -> None:
        """Rank 0: add the failure of `attempt` to self.failures from the ranks' reports, waiting
        up to `wait_s` for them; the nodes of the ranks that never reported, or reported late, are
        named."""
        if any(f.get("run") == self.nonce and f.get("attempt") == attempt for f in self.failures):
            return
        keys = {r: self._rank_key("report", attempt, r) for r in range(self.world_size)}
        deadline = time.monotonic() + wait_s
        self.store_answers = True
        while True:
            seen = {r for r, k in keys.items() if self._call(lambda k=k: self.store.check([k]), False)}
            if not self.store_answers:  # each call would wait out the timeout: name no one
                return
            if len(seen) == len(keys) or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        reports = {r: json.loads(self._get(keys[r]) or "{}") for r in sorted(seen)}
        # Silent: no report, or one that reached the store only after the rank's link came back.
        heard = {r: rep for r, rep in reports.items() if rep.get("late_s", 0) <= REPORT_WAIT_S}
        first = heard.get(0) or next(iter(heard.values()), None) or next(iter(reports.values()), {})
        silent = sorted({self._get(self._rank_key("node", attempt, r)) or f"rank {r}"
                         for r in keys if r not in heard})
        self.failures.append({"run": self.nonce, "attempt": attempt, "time": time.time(),
                              "phase": first.get("phase", "unknown"), "step": first.get("step"),
                              "error": first.get("error", ""), "silent_nodes": silent})

    def _get(self, key: str) -> str | None:
        """A key's value, or None when it is not there (a bare get would wait for it)."""
        if not self._call(lambda: self.store.check([key]), False):
            return None
        value = self._call(lambda: self.store.get(key), None)
        return value.decode() if value is not None else None

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
        doc = {"runs": runs, **self.totals(), "failures": self.failures}
        write_text_atomic(self.path, json.dumps(doc, indent=2) + "\n")


def _read(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
