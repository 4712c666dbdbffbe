"""Per-node measurements: every rank summarises its own window of steps; rank 0 keeps the cluster view.

Every `node_metrics_every` steps each rank puts one small JSON summary of its window (step,
sync, exposed-wait and compute percentiles, NIC tx/rx over the window, and the rate of each TCP
pair it sent on) into the run-wide c10d store: no collective, nothing added to a step. Rank 0
reads a window once every rank's summary is there (a window late at most; a check first, so it
never waits), appends the cluster view to `nodes.jsonl` and any event (`nodestats.SyncWatch`)
to `events.jsonl` in the run folder, which `fatpipe top` reads (docs/ARCHITECTURE.md, "The run
folder"). A failing store turns the measurements off; it never fails the run.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

import torch.distributed as dist

from fatpipe.node.env import NodeEnv

from .config import TrainConfig
from .distenv import STORE_PREFIX, DistEnv
from .nic import interface_counters, node_ip, traffic_interface
from .nodestats import EVENTS_FILE, NODES_FILE, SyncWatch, cluster_view, window_summary
from .tcpinfo import peer_rates, tcp_counters

log = logging.getLogger(__name__)

MAX_PENDING = 16  # windows rank 0 waits for before it gives the oldest up
FINAL_WAIT_S = 10.0  # at the last step, how long rank 0 waits for the others' last window


def _identity(env: DistEnv) -> dict:
    """Which node this rank is on: the launch path's node env, else torchrun's group rank."""
    group, node = int(os.environ.get("GROUP_RANK", env.rank)), NodeEnv.from_environ()
    try:
        ip = node_ip()
    except OSError:
        ip = None
    return {"rank": env.rank, "local_rank": env.local_rank,
            "node_rank": group if node.node_rank is None else node.node_rank,
            "node": node.node_name or f"{socket.gethostname()}-{group}",
            "ip": ip}


def _rounded(value):
    """Floats cut to 6 decimals (microseconds, kbit/s): lines a person can read."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _tier() -> float | None:
    try:
        return NodeEnv.from_environ().tier_gbps
    except ValueError:
        return None


class NodeMetrics:
    """One rank's window of step records; rank 0 also gathers every rank's and writes the view."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, store: dist.Store):
        self.every, self.env, self.store = cfg.node_metrics_every, env, store
        self.last_step, self.run_dir = cfg.steps, cfg.out_dir
        self.records: list[dict] = []
        self.cost = 0.0  # seconds spent here since the last summary (the benchmark reads it)
        self.mark: tuple | None = None  # (time, nic tx, nic rx, tcp counters) at the window start
        self.pending: dict[int, dict] = {}  # rank 0: window -> its own summary
        self.watch = SyncWatch()
        self._files: dict[str, object] = {}
        if self.every:
            self.me, self.tier, self.interface = _identity(env), _tier(), traffic_interface()

    def _key(self, window: int, rank: int) -> str:
        return f"{STORE_PREFIX}/nodes/{self.env.attempt}/{window}/{rank}"

    def _snapshot(self) -> tuple:
        return (time.perf_counter(), *interface_counters(self.interface), tcp_counters())

    def record(self, rec: dict) -> None:
        """Called by every rank after every step with the trainer's step record."""
        if not self.every:
            return
        started = time.perf_counter()
        try:
            self._record(rec)
        finally:
            self.cost += time.perf_counter() - started

    def _record(self, rec: dict) -> None:
        if self.mark is None:
            self.mark = self._snapshot()
        self.records.append({"step": rec["step"], "step_s": rec.get("step_s", 0.0),
                             "sync_s": rec.get("sync_s", 0.0), "exposed_comm_s": rec.get("exposed_comm_s", 0.0)})
        step = rec["step"]
        if step % self.every and step != self.last_step:
            return
        try:
            self._publish((step - 1) // self.every, final=step == self.last_step)
        except Exception as e:  # noqa: BLE001 - measuring must never be what fails the run
            log.warning("node metrics off: %s", e)
            self.every = 0

    def _publish(self, window: int, final: bool) -> None:
        now = self._snapshot()
        dt = max(now[0] - self.mark[0], 1e-9)
        summary = {**self.me, **window_summary(self.records), "window": window,
                   "tx_gbps": (now[1] - self.mark[1]) * 8 / dt / 1e9,
                   "rx_gbps": (now[2] - self.mark[2]) * 8 / dt / 1e9,
                   "peers": peer_rates(self.mark[3], now[3]), "cost_s": self.cost}
        self.records, self.mark, self.cost = [], now, 0.0
        if not self.env.is_main:
            self.store.set(self._key(window, self.env.rank), json.dumps(summary))
            return
        self.pending[window] = summary
        self._collect(wait_s=FINAL_WAIT_S if final else 0.0)

    def _collect(self, wait_s: float) -> None:
        """Rank 0: write every pending window whose summaries have all arrived."""
        deadline = time.monotonic() + wait_s
        for window in sorted(self.pending):
            keys = [self._key(window, r) for r in range(1, self.env.world_size)]
            while keys and not self.store.check(keys) and time.monotonic() < deadline:
                time.sleep(0.05)
            if keys and not self.store.check(keys):
                if len(self.pending) <= MAX_PENDING and wait_s == 0:
                    return  # later windows cannot be complete before this one
                log.warning("node metrics: window %d incomplete, skipped", window)
                del self.pending[window]
                continue
            ranks = [self.pending.pop(window)]
            for key in keys:
                ranks.append(json.loads(self.store.get(key)))
                self.store.delete_key(key)
            self._write(window, ranks)

    def _write(self, window: int, ranks: list[dict]) -> None:
        view = {"time": time.time(), "window": window, "attempt": self.env.attempt,
                "world_size": self.env.world_size, **cluster_view(ranks, self.tier)}
        self._append(NODES_FILE, view)
        for event in self.watch.update(view):
            event = {"time": view["time"], "window": window, **event}
            log.warning("event %s: %s", event["event"], event["reason"])
            self._append(EVENTS_FILE, event)

    def event(self, event: str, reason: str, step: int) -> None:
        """Rank 0: one event for `fatpipe top` (events.jsonl) and the log, outside any window
        (a node that left the quorum or joined it)."""
        if self.env.is_main:
            log.warning("event %s: %s", event, reason)
            self._append(EVENTS_FILE, {"time": time.time(), "event": event, "reason": reason,
                                       "last_step": step})

    def _append(self, name: str, doc: dict) -> None:
        if name not in self._files:
            self._files[name] = open(Path(self.run_dir) / name, "a", buffering=1)
        self._files[name].write(json.dumps(_rounded(doc)) + "\n")

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
