"""One user script's run under `trainer.api`: its comm choice, and each step's record in the run folder.

The pieces are the built-in trainer's, which uses them too (docs/ARCHITECTURE.md, "The run
folder"): `ddpcomm` registers the timed comm hook and puts the decided one in it,
`comm.commsetup` makes comm=auto's decision, `comm.periodic` runs DiLoCo or local SGD, and
`record` writes each step (metrics.jsonl, nodes.jsonl, events.jsonl), faults.json and
summary.json. What differs from `train.py`: the script owns the model's forward, so comm=auto
measures compute on the script's own first steps (DECIDE_AT, sent with plain all-reduce) instead
of on a synthetic batch; and the script owns its DDP, so comm=auto's mid-run re-decision
(`comm.redecide.AutoComm.at_step`) switches the hook in place instead of rebuilding DDP.

The record follows the script's steps: a script started again (a torchrun restart, `fatpipe
launch --run ID`) goes on counting from the last step the run folder recorded, and a script that
resumes from a checkpoint of its own passes its step (`step(..., step=N)`); steps recorded past
N stay in metrics.jsonl, replaced by the new ones (`metrics`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ..comm.allreduce import slowest, sync
from ..comm.commsetup import candidate_hooks, decide_comm, decide_measured
from ..comm.decision import CommDecision, decision_payload
from ..comm.periodic import periodic_method, sync_interval
from ..comm.redecide import AutoComm
from ..config import PERIODIC_NAMES, TrainConfig
from ..distenv import DistEnv
from .ddpcomm import grad_bytes, register_timed_hook, use_comm
from .livescript import LiveScript, live_fields, record_mirror
from .record import RunRecord

log = logging.getLogger(__name__)

DECIDE_AT = 4  # comm=auto decides after this many steps of this process; 2..DECIDE_AT give the compute


class ScriptRun:
    """The comm hook of one DDP model and the measurements of every step of the script."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, store: dist.Store, ddp: DDP,
                 allow_periodic: bool, steps_given: bool = False):
        self.cfg, self.env, self.ddp, self.device = cfg, env, ddp, env.device
        self.module = ddp.module
        self.hooks = candidate_hooks() + (PERIODIC_NAMES if allow_periodic else ())
        if not self._one_bucket():  # powerSGD_hook on gloo needs one bucket (ddpcomm says why)
            self.hooks = tuple(h for h in self.hooks if h != "powersgd")
        self._check(cfg.comm)
        self.record = RunRecord(cfg, env, store, mirror=record_mirror(cfg))
        self.record.open(known_total=steps_given)  # the console says step N/M only when the script said M
        # Rank 0 alone reads the record; every rank counts the same steps (the periodic methods
        # and comm=auto's checks go by them): the largest of every rank's is rank 0's.
        self.step_no = int(slowest(float(self.record.last_step()), self.device))
        self.taken = 0  # steps of this process
        self.meter = register_timed_hook(ddp, self.device)
        # Under live the replica group's Manager: its all-reduce is the hook's second half.
        self.live = LiveScript(ddp, env, self.meter) if cfg.fault_tolerance == "live" else None
        ddp.register_forward_pre_hook(self._step_begins)
        self.periodic = None
        self.started, self.tokens_per_step = None, 0
        self.compute: list[float] = []
        self.auto: AutoComm | None = None  # comm=auto's check and re-decision, once it decided
        self.decision = self._first_decision()
        self._apply(self.decision)

    def _one_bucket(self) -> bool:
        return self.env.backend != "gloo" or self.ddp.bucket_bytes_cap >= grad_bytes(self.module)

    def _check(self, comm: str) -> None:
        """Refuse a named comm this script cannot run, before anything is registered or opened."""
        if comm in PERIODIC_NAMES and comm not in self.hooks:
            raise RuntimeError(f"comm={comm} changes the optimizer step: pass "
                               "allow_periodic=True to fatpipe's wrap() and call its step() after "
                               "optimizer.step()")
        if comm == "powersgd" and "powersgd" not in self.hooks:
            raise RuntimeError("comm=powersgd on gloo needs one DDP bucket: leave bucket_cap_mb "
                               "to fatpipe's wrap()")

    def _first_decision(self) -> CommDecision | None:
        """The named hook, or None while comm=auto measures the script's first steps."""
        cfg, env = self.cfg, self.env
        if cfg.comm == "auto" and env.world_size > 1:
            return None
        return decide_comm(cfg, env, self.module, grad_bytes(self.module), None)

    def _apply(self, decision: CommDecision | None) -> None:
        self.comm = decision.comm if decision else "none"
        if self.comm in PERIODIC_NAMES:
            # Every replica keeps its own gradients (the hook sends nothing) until the method syncs.
            self.meter.passthrough = True
            self.periodic = periodic_method(self.comm, sync_interval(decision, self.cfg.sync_every),
                                            self.module, None, self.cfg.steps, self.device,
                                            self.step_no)
            return
        use_comm(self.meter, self.cfg, decision or CommDecision("none", "deciding"))

    def _step_begins(self, module, inputs) -> None:
        """DDP's forward pre-hook: the first forward of a step starts its clock (an evaluation
        under torch.no_grad() between steps does not)."""
        if self.started is None and torch.is_grad_enabled():
            if self.live:
                self.live.begin()  # the step's quorum, before its gradients sync
            self.started = time.perf_counter()
            self.meter.begin_step()

    def step(self, loss, tokens: int, lr: float | None, step: int | None = None) -> dict | None:
        """Every rank, once per optimizer step, after optimizer.step(): the step's record, as
        step `step` (by default the one after the last). Under live, the quorum's count of
        committed steps; a step that did not commit is not recorded (None)."""
        outcome = self.live.take_outcome() if self.live else None
        if outcome is not None:
            if not outcome.committed:
                self.started = None
                self.meter.end_step()
                return None
            step = self.live.steps_done()
        self.step_no = self.step_no + 1 if step is None else step
        self.taken += 1
        step = self.step_no
        if self.periodic:
            self.periodic.after_step(step)
        loss_value = float(loss.detach().item() if torch.is_tensor(loss) else loss)
        sync(self.device)  # all streams, so the step time and the hook's CUDA events are final
        now = time.perf_counter()
        step_s = now - (self.started if self.started is not None else now)
        self.started = None
        comm = self.periodic.end_step() if self.periodic else self.meter.end_step()
        self.tokens_per_step = tokens * self.env.world_size
        rec = self.record.measure(step, loss_value, None if lr is None else float(lr), step_s,
                                  self.tokens_per_step * (outcome.participants if outcome else 1),
                                  comm, self.comm)
        if outcome:
            rec.update(live_fields(outcome, rec))
            if change := self.live.quorum.update(step, outcome.participants):
                self.record.nodes.event(*change, step)
        if self.auto:
            rec = self.auto.observe(rec)
        self.record.write(rec)
        if self.decision is None:
            self._measure_then_decide(step, step_s - comm.exposed_s)
        elif self.auto:
            # A switch puts the new hook in the timed comm hook in place (the script's DDP and
            # its bucket layout stay; a fresh PowerSGD state when switching to it).
            self.auto.at_step(step, self.module, self._apply, self._cannot_take)
            self.decision = self.auto.decision
        return rec

    def _cannot_take(self, comm: str) -> str | None:
        """Why this script's DDP cannot switch to `comm` in place, or None."""
        if comm not in self.hooks:
            return ("PowerSGD on gloo needs one DDP bucket and this model has several (leave "
                    "bucket_cap_mb to fatpipe's wrap())")
        return None

    def _measure_then_decide(self, step: int, compute_s: float) -> None:
        """comm=auto: the compute of this process's steps 2..DECIDE_AT (the first allocates),
        then the decision, at the run's step `step`."""
        if self.taken > 1:
            self.compute.append(compute_s)
        if self.taken < DECIDE_AT:
            return
        compute = slowest(min(self.compute), self.device)
        decided = decide_measured(self.cfg, self.env, self.module, compute, step=step,
                                  hooks=self.hooks)
        self.decision = replace(decided, since_step=step)
        self._apply(self.decision)
        self.auto = AutoComm(self.cfg, self.env, self.decision, step)

    def finish(self) -> None:
        """Rank 0: summary.json and faults.json from what the steps recorded; files closed."""
        main = self.record.metrics is not None
        self.record.close()
        if self.live:
            self.live.close()
        if not main:
            return
        records = self.record.records()
        if self.record.failed or not records:
            self.record.faults.save()
            return
        self.record.write_summary(
            records, self.tokens_per_step, comm=self.comm,
            comm_decision=decision_payload(self.decision) if self.decision else None,
            preset="script", params=sum(p.numel() for p in self.module.parameters()),
            **(self.auto.summary(records) if self.auto else {}),
            **(self.live.summary(records, self.tokens_per_step) if self.live else {}))
