"""One optimizer step under `fault_tolerance = "live"`: quorum, gradients averaged over the replica
groups that are up, and an optimizer step only when torchft says the step may commit.

A step that fails (a peer died in its all-reduce, the quorum changed under it) is not committed:
its gradients are dropped, nothing moved, and the same step is taken again at the next quorum
with the same data. So a lost node costs time, never a step.

The mean is over the gradients contributed: a replica that is catching up (it is sent the live
weights during this step) or has left adds nothing; torchft zeroes a catching-up replica's
gradient and divides by the replicas that took part. The learning rate is not scaled when fewer
replicas take part: the step's gradient is still the mean over the batch that was read, only
noisier (the linear scaling rule would lower it; at one node of four gone it is within the
run's warmup noise, and restoring it when the node returns would be a jump).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .epochs import link_rate, quorum_timings
from .timeouts import allreduce_timed

log = logging.getLogger(__name__)

GRAD_CLIP = 1.0
# Quorum requests (each QUORUM_TIMEOUT_S, live.manager) before a run gives up on the Lighthouse.
QUORUM_TRIES = 24
# A fresh run waits this long for every declared node before its first step (`gather_quorum`).
GATHER_S = 120.0


@dataclass(frozen=True)
class LiveStepResult:
    """What one attempt at a step did."""

    committed: bool
    participants: int  # replica groups whose gradients made the mean
    healed: bool  # this replica was sent the live state during the step
    quorum_s: float  # time spent waiting for the quorum (the replica groups' skew, mostly)
    timings: dict = field(default_factory=dict)  # the quorum's parts (`epochs.quorum_timings`)


class AcrossReplicas:
    """The comm hook's second half: `across(tensor)` averages it over the replica groups in the
    quorum. `manager`: the replica group's, for PowerSGD's own all-reduces (`live.powersgd`).

    Waits like torchft's own DDP hook: on an error the manager has recorded it, the tensor may
    be garbage, and the step will not commit. Each all-reduce's rate is the link's measure for a
    heal's timeouts (`live.timeouts`).
    """

    def __init__(self, manager):
        self.manager, self.link = manager, link_rate(manager)

    def __call__(self, tensor: torch.Tensor) -> torch.futures.Future:
        allreduce_timed(self.manager, self.link, tensor)
        done = torch.futures.Future()
        done.set_result(tensor)
        return done


def across_replicas(manager) -> AcrossReplicas:
    return AcrossReplicas(manager)


def join_quorum(manager) -> None:
    """A step's quorum, waited for before the forward pass (so that a failure to form one is
    handled here, not inside backward's comm hook), asked again after a timeout: a request in
    flight to a Lighthouse that died is lost with it, and a Lighthouse started again has the
    others' next requests within seconds. After QUORUM_TRIES the error is the run's."""
    for tries in range(1, QUORUM_TRIES + 1):
        try:
            manager.start_quorum()
            manager.wait_quorum()
            return
        except TimeoutError as e:
            if tries == QUORUM_TRIES:
                raise TimeoutError(f"no quorum from the Lighthouse in {tries} tries: {e}") from e
            log.warning("no quorum yet (%s): asking the Lighthouse again", e)
            # torchft 0.2.0 re-raises a failed quorum at the next start_quorum: forget it.
            manager._quorum_future = None


def gradients_finite(parameters) -> bool:
    """Whether every gradient is finite: a peer that died mid all-reduce can leave garbage."""
    grads = [p.grad for p in parameters if p.grad is not None]
    return not grads or math.isfinite(float(torch.nn.utils.get_total_norm(grads)))


def gather_quorum(manager, nodes: int, grace_s: float = GATHER_S) -> int:
    """A fresh run's first quorum: wait up to `grace_s` for the `nodes` the cluster declares
    (they start within seconds of each other), so step 1 is not taken by the first node up
    alone. A node that joins a run under way (the quorum is past step 0) does not wait. The
    last quorum is the first step's: a returning node's copy of the live state, set up by it,
    is applied when that step commits. Returns the replica groups in the quorum."""
    deadline = time.monotonic() + grace_s
    while True:
        join_quorum(manager)
        if (manager.num_participants() >= nodes or manager.current_step() > 0
                or time.monotonic() > deadline):
            return manager.num_participants()
        time.sleep(0.5)


class LiveStep:
    """Runs steps for one rank of a replica group: `attempt(step_fn)` until one commits."""

    def __init__(self, manager, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler):
        self.manager, self.model = manager, model
        self.optimizer, self.scheduler = optimizer, scheduler
        self._quorum_started = False  # `gather` left its last quorum for the first step

    @property
    def step(self) -> int:
        """The step the next attempt takes (1 for the first): committed steps + 1."""
        return self.manager.current_step() + 1

    def attempt(self, forward_backward: Callable[[int], float]) -> tuple[float, LiveStepResult]:
        """Start the quorum, run `forward_backward(step)` (its gradients sync through the comm
        hook), clip, and step the optimizer if the step commits. Returns its loss and result."""
        manager = self.manager
        waited = time.perf_counter()
        if not self._quorum_started:
            join_quorum(self.manager)
        self._quorum_started = False
        quorum_s = time.perf_counter() - waited
        timings = quorum_timings(manager)
        loss = forward_backward(self.step)
        healed = not manager.is_participating()
        participants = manager.num_participants()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        if not math.isfinite(float(norm)):  # a garbled all-reduce after a peer died
            manager.report_error(RuntimeError("non-finite gradient after the all-reduce"))
        committed = manager.should_commit()  # applies the live state a healing replica was sent
        if committed:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, LiveStepResult(committed, participants, healed, quorum_s, timings)

    def gather(self, nodes: int, grace_s: float) -> int:
        """The first step's quorum, with every declared node (`gather_quorum`)."""
        self._quorum_started = True
        return gather_quorum(self.manager, nodes, grace_s)

    def close(self) -> None:
        self.manager.shutdown(wait=False)
