"""What every step of a run leaves in the run folder, for the built-in trainer and a user's script
alike (docs/ARCHITECTURE.md, "The run folder"): metrics.jsonl (rank 0), nodes.jsonl and
events.jsonl (`nodemetrics`), faults.json (`faults`), and summary.json at the end.

One implementation, so `fatpipe top`, `fatpipe report` and the summary read the same fields
whichever of the two trained.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch.distributed as dist

from ..bandwidth import busbw_gbs
from ..comm.hooks import StepComm
from ..config import TrainConfig
from ..distenv import DistEnv
from ..faults import FaultLedger, is_collective_failure
from ..files import write_text_atomic
from ..metrics import METRICS_FILE, MetricsLog, read_metrics, summarize
from ..nic import NicMeter, traffic_interface
from ..nodemetrics import NodeMetrics

log = logging.getLogger(__name__)


class RunRecord:
    """One rank's writers of the run folder: each step's record, node windows, fault counts."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, store: dist.Store,
                 mirror: Path | None = None):
        """`store` is the run-wide store (it outlives an attempt), where faults are counted;
        `mirror`: a folder that gets a copy of metrics.jsonl and summary.json, and is the one
        read back (live's node 0: `live.runplan.own_record`)."""
        self.cfg, self.env, self.mirror = cfg, env, mirror
        self.faults = FaultLedger(cfg.out_dir, store, env.attempt, env.is_main)
        self.nodes = NodeMetrics(cfg, env, store)  # per-node windows: nodes.jsonl, events.jsonl
        self.nic: NicMeter | None = None
        self.metrics: MetricsLog | None = None
        self.failed = False

    def open(self, known_total: bool = True) -> None:
        """Just before the first step: the NIC's rates count from here (not the setup's traffic);
        rank 0's metrics.jsonl, appended to (`metrics`: a run never cuts its record)."""
        self.nic = NicMeter(traffic_interface())
        if self.env.is_main:
            self.metrics = MetricsLog(self.cfg.out_dir, self.cfg.steps if known_total else None,
                                      mirror=self.mirror)

    def last_step(self) -> int:
        """Rank 0: the last step the run folder recorded (0: none); other ranks: 0."""
        return self.metrics.last_step if self.metrics else 0

    def measure(self, step: int, loss: float, lr: float | None, step_s: float, tokens_per_step: int,
                comm: StepComm, comm_name: str) -> dict:
        """The step's record: its time, what its gradient sync cost and sent, the NIC's rates."""
        tx, rx = self.nic.rates()
        return {
            "step": step, "loss": loss, "lr": lr, "step_s": step_s,
            "tokens_per_s": tokens_per_step / step_s if step_s else 0.0,
            "sync_s": comm.sync_s, "exposed_comm_s": comm.exposed_s,
            "grad_bytes": comm.grad_bytes, "wire_bytes": comm.wire_bytes,
            "busbw_gbps": (busbw_gbs(comm.wire_bytes, comm.sync_s, self.env.world_size) * 8
                           if comm.sync_s else 0.0),
            "nic_tx_gbps": tx, "nic_rx_gbps": rx, "comm": comm_name,
        }

    def write(self, rec: dict) -> None:
        """Every rank, every step: collectives issued (rank 0 counts them, at most once a second),
        the record, the window."""
        self.faults.push(now=False)
        if self.metrics:
            self.metrics.log(rec)
        self.nodes.record(rec)

    def fail(self, error: BaseException, point: tuple[str, int | None] | None = None) -> None:
        """The run failed with `error`: no summary.json; a failed collective counted in faults.json."""
        self.failed = True
        if is_collective_failure(error):
            self.faults.record_failure(error, point)

    def records(self) -> list[dict]:
        """Rank 0: the run's steps in metrics.jsonl, all attempts, each as recorded last."""
        return read_metrics((self.mirror or self.cfg.out_dir) / METRICS_FILE)

    def write_summary(self, records: list[dict], tokens_per_step: int, **fields) -> dict:
        """Rank 0: summary.json from `records`, the fault counts and `fields` (comm, comm_decision,
        preset, params, ...); faults.json saved beside it."""
        fields.setdefault("world_size", self.env.world_size)  # live: the cluster's ranks
        # `fields` win: under live the failure rate is over the exchanges across the groups.
        summary = summarize(records, tokens_per_step, restarts=self.env.restarts,
                            **{**self.faults.totals(), **fields})
        self.faults.save()
        path = self.cfg.out_dir / "summary.json"
        for folder in filter(None, (self.mirror, self.cfg.out_dir)):
            write_text_atomic(folder / "summary.json", json.dumps(summary, indent=2) + "\n")
        held = (f", eval loss {summary['eval_loss']:.4f} (held out)"
                if summary.get("eval_loss") is not None else "")
        log.info("summary: loss %.4f%s, %.0f tokens/s, step p50 %.1f ms, sync p50 %.1f ms -> %s",
                 summary["final_loss"] if summary["final_loss"] is not None else math.nan, held,
                 summary["tokens_per_s"], summary["step_s_p50"] * 1e3,
                 summary["sync_s_p50"] * 1e3, path)
        return summary

    def close(self) -> None:
        self.nodes.close()
        if self.metrics:
            self.metrics.close()
            self.metrics = None
