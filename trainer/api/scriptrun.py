"""One user script's run under `trainer.api`: its comm choice, and each step's record in the run folder.

The pieces are the built-in trainer's (docs/ARCHITECTURE.md, "The run folder"): `hooks`
measures what DDP's comm hook sends, `commsetup` makes comm=auto's decision, `periodic` runs
DiLoCo or local SGD, `metrics` writes metrics.jsonl and summary.json (rank 0), `nodemetrics`
nodes.jsonl and events.jsonl, `faults` faults.json. What differs from `train.py`: the script
owns the model's forward, so comm=auto measures compute on the script's own first steps
(DECIDE_AT, sent with plain all-reduce) instead of on a synthetic batch.
"""

from __future__ import annotations

import json
import logging
import math
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ..bandwidth import busbw_gbs
from ..comm.allreduce import slowest, sync
from ..comm.commsetup import candidate_hooks, decide_comm, decide_measured
from ..comm.hooks import TimedCommHook, make_powersgd_state
from ..comm.periodic import DiLoCo, LocalSGD, sync_interval
from ..config import HOOK_NAMES, PERIODIC_NAMES, TrainConfig
from ..distenv import DistEnv
from ..faults import FaultLedger
from ..files import write_text_atomic
from ..metrics import MetricsLog, read_metrics, summarize
from ..nic import NicMeter, traffic_interface
from ..nodemetrics import NodeMetrics

log = logging.getLogger(__name__)

DECIDE_AT = 4  # comm=auto decides after this step; steps 2..DECIDE_AT give the compute time


class ScriptRun:
    """The comm hook of one DDP model and the measurements of every step of the script."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, store: dist.Store, ddp: DDP,
                 allow_periodic: bool):
        self.cfg, self.env, self.ddp, self.device = cfg, env, ddp, env.device
        self.module = ddp.module
        self.hooks = candidate_hooks() + (PERIODIC_NAMES if allow_periodic else ())
        if not self._one_bucket():  # powerSGD_hook on gloo needs one bucket (train.py says why)
            self.hooks = tuple(h for h in self.hooks if h != "powersgd")
        self._check(cfg.comm)
        self.faults = FaultLedger(cfg.out_dir, store, env.attempt, env.is_main)
        self.nodes = NodeMetrics(cfg, env, store)
        self.nic = NicMeter(traffic_interface())
        self.metrics = MetricsLog(cfg.out_dir, cfg.steps, 0) if env.is_main else None
        self.meter = TimedCommHook(self.device)
        ddp.register_comm_hook(None, self.meter.hook)
        ddp.register_forward_pre_hook(self._step_begins)
        self.periodic = None
        self.step_no, self.started, self.tokens_per_step = 0, None, 0
        self.compute: list[float] = []
        self.failed = False
        self.decision = self._first_decision()
        self._apply(self.decision)

    def _one_bucket(self) -> bool:
        grad_bytes = sum(p.numel() * p.element_size() for p in self.module.parameters())
        return self.env.backend != "gloo" or self.ddp.bucket_bytes_cap >= grad_bytes

    def _check(self, comm: str) -> None:
        """Refuse a named comm this script cannot run, before anything is registered or opened."""
        if comm in PERIODIC_NAMES and comm not in self.hooks:
            raise RuntimeError(f"comm={comm} changes the optimizer step: pass "
                               "allow_periodic=True to fatpipe's wrap() and call its step() after "
                               "optimizer.step()")
        if comm == "powersgd" and "powersgd" not in self.hooks:
            raise RuntimeError("comm=powersgd on gloo needs one DDP bucket: leave bucket_cap_mb "
                               "to fatpipe's wrap()")

    def _first_decision(self) -> dict | None:
        """The named hook, or None while comm=auto measures the script's first steps."""
        cfg, env = self.cfg, self.env
        if cfg.comm == "auto" and env.world_size > 1:
            return None
        grad_bytes = sum(p.numel() * p.element_size() for p in self.module.parameters())
        return decide_comm(cfg, env, self.module, grad_bytes, None)

    def _apply(self, decision: dict | None) -> None:
        self.comm = decision["comm"] if decision else "none"
        if self.comm in PERIODIC_NAMES:
            # Every replica keeps its own gradients (the hook sends nothing) until the method syncs.
            self.meter.passthrough = True
            kind = DiLoCo if self.comm == "diloco" else LocalSGD
            self.periodic = kind(self.module, None, sync_interval(decision, self.cfg.sync_every),
                                 self.cfg.steps, self.device, start_step=self.step_no)
            return
        state = None
        if self.comm == "powersgd":
            state = make_powersgd_state(self.cfg.powersgd_rank, self.cfg.warmup_steps
                                        - decision.get("since_step", 0), self.cfg.seed)
        self.meter.use(self.comm if self.comm in HOOK_NAMES else "none", state)

    def _step_begins(self, module, inputs) -> None:
        """DDP's forward pre-hook: the first forward of a step starts its clock (an evaluation
        under torch.no_grad() between steps does not)."""
        if self.started is None and torch.is_grad_enabled():
            self.started = time.perf_counter()
            self.meter.begin_step()

    def record(self, loss, tokens: int, lr: float | None) -> dict:
        """Every rank, once per optimizer step, after optimizer.step(): the step's record."""
        self.step_no += 1
        step = self.step_no
        if self.periodic:
            self.periodic.after_step(step)
        loss_value = float(loss.detach().item() if torch.is_tensor(loss) else loss)
        sync(self.device)  # all streams, so the step time and the hook's CUDA events are final
        now = time.perf_counter()
        step_s = now - (self.started if self.started is not None else now)
        self.started = None
        comm = self.periodic.end_step() if self.periodic else self.meter.end_step()
        tx, rx = self.nic.rates()
        self.tokens_per_step = tokens * self.env.world_size
        rec = {
            "step": step, "loss": loss_value, "lr": float(lr or 0.0), "step_s": step_s,
            "tokens_per_s": self.tokens_per_step / step_s if step_s else 0.0,
            "sync_s": comm.sync_s, "exposed_comm_s": comm.exposed_s,
            "grad_bytes": comm.grad_bytes, "wire_bytes": comm.wire_bytes,
            "busbw_gbps": (busbw_gbs(comm.wire_bytes, comm.sync_s, self.env.world_size) * 8
                           if comm.sync_s else 0.0),
            "nic_tx_gbps": tx, "nic_rx_gbps": rx, "comm": self.comm,
        }
        self.faults.push()
        if self.metrics:
            self.metrics.log(rec)
        self.nodes.record(rec)
        if self.decision is None:
            self._measure_then_decide(step, step_s - comm.exposed_s)
        return rec

    def _measure_then_decide(self, step: int, compute_s: float) -> None:
        """comm=auto: the compute of steps 2..DECIDE_AT (the first allocates), then the decision."""
        if step > 1:
            self.compute.append(compute_s)
        if step < DECIDE_AT:
            return
        compute = slowest(min(self.compute), self.device)
        self.decision = decide_measured(self.cfg, self.env, self.module, compute, step=step,
                                        hooks=self.hooks)
        self.decision["since_step"] = step
        self._apply(self.decision)

    def finish(self) -> None:
        """Rank 0: summary.json and faults.json from what the steps recorded; files closed."""
        self.nodes.close()
        if not self.metrics:
            return
        self.metrics.close()
        self.metrics, records = None, read_metrics(self.cfg.out_dir / "metrics.jsonl")
        if self.failed or not records:
            self.faults.save()
            return
        summary = summarize(
            records, self.tokens_per_step, comm=self.comm, comm_decision=self.decision,
            restarts=self.env.restarts, world_size=self.env.world_size, preset="script",
            params=sum(p.numel() for p in self.module.parameters()), **self.faults.totals())
        self.faults.save()
        write_text_atomic(self.cfg.out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        log.info("summary: loss %.4f, %.0f tokens/s, step p50 %.1f ms, sync p50 %.1f ms -> %s",
                 summary["final_loss"] if summary["final_loss"] is not None else math.nan,
                 summary["tokens_per_s"], summary["step_s_p50"] * 1e3,
                 summary["sync_s_p50"] * 1e3, self.cfg.out_dir / "summary.json")
