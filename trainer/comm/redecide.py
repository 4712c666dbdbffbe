"""comm=auto after setup: check the prediction against the run, and re-decide when the world changes.

Every step, `AutoComm.observe` adds the chosen hook's predicted step (`predicted_step_s`) to the
metrics record and, once a warm-up window of steady steps is in (past PowerSGD's plain start),
the measured p50 over the last WINDOW steps against it (`prediction_error`). When that p50 stays
off its reference by more than THRESHOLD, the run re-probes the link (collective; every rank
acts on rank 0's verdict) and applies the model again (`reprobe`, one implementation for both
users below). If another hook then wins by MARGIN over the steps left, every rank switches.

The built-in trainer (`at_checkpoint`) asks at its checkpoint boundaries and switches before the
checkpoint is written, so the checkpoint carries the new decision and a restart from it
continues exactly as the uninterrupted run does (`commsetup.decide_comm` keeps a checkpoint's
decision). The trainer's own callback (`train.Trainer.rebuild_ddp`) rebuilds its DDP as a resume
would (bucket layout, layout warm-up, the hook with a fresh PowerSGD state): PowerSGD on gloo
needs one bucket, the other hooks DDP's own layout.

A user's script (`trainer.api`, `at_step`) has no checkpoint boundary fatpipe knows, and its DDP
is the script's: it asks every `every` steps, a number that follows from the decision every
rank holds, so all ranks ask in the same per-step call, and it switches the hook in place in the
timed comm hook. PowerSGD is taken there only when the model was wrapped with one bucket.

Leaving PowerSGD drops its error feedback (the residual of compressions already applied; plain
gradients from then on carry no compression bias). No flapping: after a re-probe that keeps the
hook, a re-probe needs the p50 off both the new prediction and the p50 it was taken at, a new
hook must win by MARGIN, and a run re-probes at most MAX_REPROBES and switches at most
MAX_SWITCHES times.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from ..collectives import broadcast_flag
from ..config import HOOK_NAMES, TrainConfig
from ..distenv import DistEnv
from ..metrics import percentile
from .commsetup import plain_steps, redecide_comm
from .costmodel import EXPOSED_BUDGET  # a less lossy hook within it may replace a faster one
from .decision import CommDecision, Switch, SwitchRefused

log = logging.getLogger(__name__)

WINDOW = 5  # steps whose p50 is compared with the reference
WARM_STEPS = 2  # steps after a (re)start or switch before measuring: allocation, first-touch
THRESHOLD = 0.30  # relative error of the window's p50 that triggers a re-probe
MARGIN = 0.15  # a new hook must be this much faster over the steps left to replace the current
MAX_SWITCHES = 2
MAX_REPROBES = 4
# A script's check is one broadcast of one integer, about one round trip of the link (measured:
# 1.4 ms on gloo, 2 ranks over loopback on a busy 2-core machine; a pickled object, 1.9 ms).
# Asked every `check_every` steps, it costs at most CHECK_SHARE of their time (a 0.5 s step on
# such a link: 0.06% at the floor; 50 ms round trips and 0.5 s steps: every 20 steps); at least
# WINDOW steps apart (a window is what a verdict needs), at most MAX_CHECK_EVERY, which bounds
# how late a change is noticed.
CHECK_SHARE = 0.005
MAX_CHECK_EVERY = 50


def check_every(decision: CommDecision) -> int:
    """Steps between a script's checks: the same on every rank, since the decision is."""
    latency = decision.link.latency_s if decision.link else 0.0  # a named hook has no link
    step_s = decision.chosen["step_s"] if decision.chosen else 0.0
    if step_s <= 0:
        return MAX_CHECK_EVERY
    return min(MAX_CHECK_EVERY, max(WINDOW, math.ceil(latency / (CHECK_SHARE * step_s))))


class AutoComm:
    """The prediction check and the mid-run re-decision of one run (rank 0 judges)."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, decision: CommDecision, start_step: int):
        self.enabled = cfg.comm == "auto" and env.world_size > 1 and cfg.redecide
        self.checking = cfg.comm == "auto" and env.world_size > 1
        self.cfg, self.env = cfg, env
        self._reset(decision, start_step)

    def _reset(self, decision: CommDecision, step: int) -> None:
        """Start a new measuring window for `decision`, taken at `step`."""
        self.decision = decision
        self.window: deque[float] = deque(maxlen=WINDOW)
        since = decision.since_step
        plain = plain_steps(self.cfg, since, None) if decision.comm == "powersgd" else 0
        self.steady_from = since + plain + WARM_STEPS + 1  # for the summary: every attempt
        self.measure_from = max(step + WARM_STEPS + 1, self.steady_from)
        self.predicted = decision.chosen["step_s"] if decision.chosen else None
        self.reference = self.predicted
        self.every = check_every(decision)

    def observe(self, rec: dict) -> dict:
        """Add the prediction and its measured error to a step's metrics record."""
        if not self.checking or self.predicted is None:
            return rec
        rec["predicted_step_s"] = self.predicted
        rec["prediction_error"] = None
        if rec["step"] >= self.measure_from:
            self.window.append(rec["step_s"])
            if len(self.window) == WINDOW:
                rec["prediction_error"] = self.p50() / self.predicted - 1
        return rec

    def p50(self) -> float:
        return percentile(list(self.window), 50)

    def off(self) -> bool:
        """Whether the window's p50 is off both the prediction and the step last re-probed at
        (a transient slowdown that passes triggers nothing the second time)."""
        if len(self.window) < WINDOW or self.predicted is None:
            return False
        p50 = self.p50()
        return (all(abs(p50 / ref - 1) > THRESHOLD for ref in (self.predicted, self.reference))
                and len(self.decision.switches) < MAX_SWITCHES
                and self.decision.reprobes < MAX_REPROBES)

    def agreed_off(self) -> bool:
        """Collective: rank 0's `off` verdict, the same on every rank."""
        return broadcast_flag(self.off() if self.env.is_main else None, 0, self.env.device)

    def at_checkpoint(self, step: int, model, rebuild: Callable[[CommDecision], None]
                      ) -> CommDecision:
        """The built-in trainer, collective at a checkpoint boundary before the last: re-probe if
        rank 0 saw the step stay off, and switch if another hook now wins (`rebuild(new
        decision)`: the trainer's DDP rebuilt for it, `train.Trainer.rebuild_ddp`). Returns the
        decision the run goes on with."""
        if not self.enabled or step >= self.cfg.steps or self.decision.comm not in HOOK_NAMES:
            return self.decision  # a periodic method keeps the state it was set up with
        if self.agreed_off():
            return self.reprobe(model, step, rebuild)
        return self.decision

    def at_step(self, step: int, model, apply: Callable[[CommDecision], None],
                refuse: Callable[[str], str | None]) -> None:
        """A script's per-step call, every rank: every `every` steps rank 0's verdict, and a
        re-probe when it says so. Steps past the run's `steps` have none left to price."""
        if (self.enabled and self.decision.comm in HOOK_NAMES and step < self.cfg.steps
                and step % self.every == 0 and self.agreed_off()):
            self.reprobe(model, step, apply, refuse)

    def reprobe(self, model, step: int, apply: Callable[[CommDecision], None],
                refuse: Callable[[str], str | None] = lambda name: None) -> CommDecision:
        """Collective, at a step every rank agreed on: probe the link again, apply the model, and
        switch every rank (`apply(new decision)`) if another hook now wins and `refuse(name)`
        gives no reason this run cannot take it. Returns the decision the run goes on with."""
        measured, started = self.p50(), time.perf_counter()
        current = self.decision
        new = redecide_comm(self.cfg, self.env, model, current, step)
        probed = time.perf_counter()
        name, cur = new.comm, current.comm
        before, after = new.predicted[cur]["run_step_s"], new.predicted[name]["run_step_s"]
        # Only DDP hooks are switched to: a periodic method's state is built at setup.
        wins = name != cur and name in HOOK_NAMES and (after <= (1 - MARGIN) * before or (
            HOOK_NAMES.index(name) < HOOK_NAMES.index(cur)
            and new.predicted[name]["share"] <= EXPOSED_BUDGET))
        refused = refuse(name) if wins else None
        # The world as measured now, with what the run did so far carried over.
        new = replace(new, reprobes=current.reprobes + 1, switches=current.switches)
        if not wins or refused:
            # Keep the hook; the world as measured now is the reference for the next change.
            new = replace(new, comm=cur, reason=current.reason, since_step=current.since_step,
                          switch_refused=SwitchRefused(step, name, refused) if refused else None)
            self._reset(new, step)
            self.reference = measured
            if self.env.is_main:
                log.info("comm=auto at step %d: step p50 %.0f ms against %.0f ms predicted; "
                         "re-probed, keeping %s%s", step, measured * 1e3,
                         current.predicted[cur]["step_s"] * 1e3, cur,
                         f"; not switching to {name}: {refused}" if refused else "")
            return new
        new = replace(new, since_step=step)
        apply(new)
        # The re-probe and the switch: time the run spent outside any step's step_s.
        s = Switch(step, cur, name, measured, current.predicted[cur]["step_s"], before, after,
                   new.link.busbw_gbps, new.link.latency_s, probed - started,
                   time.perf_counter() - started)
        new = replace(new, switches=current.switches + (s,))
        self._reset(new, step)
        if self.env.is_main:
            log.warning("comm=auto switched %s -> %s at step %d: step p50 %.0f ms (predicted "
                        "%.0f); link now %.3f Gbit/s busbw; predicted %.0f -> %.0f ms/step over "
                        "the steps left; re-probe %.1f s, re-probe and switch %.1f s", cur, name,
                        step, s.measured_step_s_p50 * 1e3, s.predicted_step_s_before * 1e3,
                        s.busbw_gbps, s.repredicted_run_step_s * 1e3,
                        s.predicted_run_step_s * 1e3, s.probe_s, s.pause_s)
        return new

    def summary(self, records: list[dict]) -> dict:
        """summary.json's comm=auto fields: the prediction for the hook the run ended on against
        its measured p50 (steady steps after its warm-up), and the switches."""
        if not self.checking or self.predicted is None:
            return {}
        steady = [r["step_s"] for r in records if r["step"] >= self.steady_from]
        measured = percentile(steady, 50) if steady else None
        return {
            "comm_prediction": {
                "comm": self.decision.comm, "predicted_step_s": self.predicted,
                "measured_step_s_p50": measured, "steps_measured": len(steady),
                "error": measured / self.predicted - 1 if measured else None},
            "comm_switches": len(self.decision.switches),
            "comm_reprobes": self.decision.reprobes,
        }

