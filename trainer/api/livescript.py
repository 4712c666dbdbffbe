"""A user script's run under `fault_tolerance = "live"`: its node is one replica group of torchft's
(docs/ARCHITECTURE.md, "Live fault tolerance"), and its optimizer, wrapped, is where the step
commits.

    model = fatpipe.wrap(model)
    optimizer = fatpipe.optimizer(torch.optim.AdamW(model.parameters()))  # the fourth line
    while fatpipe.steps_done() < steps:
        ...forward, backward...
        optimizer.step()                    # steps only when the quorum commits
        fatpipe.step(loss, tokens=x.numel())

The step's quorum is joined at the first forward of the step (DDP's forward pre-hook, so it does
not matter where the script calls zero_grad), the gradients are averaged over the replica
groups that are up (the timed comm hook's second half, as in the built-in trainer), and
`optimizer.step()` steps only when torchft's `should_commit` agrees, returning whether it did. A
returning node is sent the model, the optimizer and what else `fatpipe.optimizer` was given (a
scheduler) by a peer, at that commit; at the run's first quorum every node is sent one node's
state, so nodes that initialised their models differently start alike. A step that does not
commit is not taken again (the script's next batch follows); the script reads its data by
`fatpipe.data_shard()`, so a node that is down leaves its shard unread.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ..config import TrainConfig
from ..distenv import DistEnv
from ..exiting import stop_before_join
from ..live.manager import live_manager, settings_from_env
from ..live.membership import Attempts, QuorumWatch, run_fields, step_fields
from ..live.runplan import live_comm, node_run_dir, own_record, require_torchft
from ..live.step import across_replicas, gather_quorum, gradients_finite, join_quorum
from ..replicas import param_digest

log = logging.getLogger(__name__)


def live_config(cfg: TrainConfig) -> TrainConfig:
    """A script's settings under live: torchft there, a comm torchft's all-reduce carries, and
    this node's own folder to record into."""
    require_torchft()
    node_rank = settings_from_env().node_rank
    return replace(cfg, comm=live_comm(cfg.comm), out=str(node_run_dir(cfg.out_dir, node_rank)))


def record_mirror(cfg: TrainConfig) -> Path | None:
    """Under live, where node 0 keeps a copy of its own record (`live.runplan.own_record`)."""
    if cfg.fault_tolerance != "live":
        return None
    return own_record(cfg.out_dir, settings_from_env().node_rank)


def live_fields(outcome: StepOutcome, rec: dict) -> dict:
    return step_fields(outcome.participants, outcome.healed, outcome.quorum_s, rec,
                       outcome.attempts)


@dataclass(frozen=True)
class StepOutcome:
    """What the last optimizer step did under live."""

    committed: bool
    participants: int  # replica groups whose gradients made the mean
    healed: bool  # this node was sent the live state at this step
    quorum_s: float  # time spent waiting for the quorum
    attempts: int = 1  # optimizer steps at this step number on this node, this one included


class LiveScript:
    """One rank's side of a script's live run: the Manager, the quorum, the commit."""

    def __init__(self, ddp: DDP, env: DistEnv, meter):
        # DDP rebuilds its buckets in gradient-ready order after its first step, and a node that
        # rejoins sums its first step's buckets with its peers' later ones: element by element,
        # the wrong gradients. DDP keeps its first layout when it looks for unused parameters
        # (the built-in trainer settles the layout with a step of its own: comm.layout).
        if not ddp.find_unused_parameters or ddp.static_graph:
            raise RuntimeError("under fault_tolerance = \"live\" DDP must keep one bucket layout: "
                               "build it with find_unused_parameters=True and no static_graph, "
                               "or let fatpipe.wrap() build it")
        self.settings, self.world_size = settings_from_env(), env.world_size
        self.module = ddp.module
        self.stateful: list = []  # what fatpipe.optimizer() was given, sent to a returning node
        self.manager = live_manager(self.settings, self._state, self._load, env.local_rank,
                                    env.world_size, init_sync=True)
        meter.across, meter.node_size = across_replicas(self.manager), env.world_size
        self.meter = meter  # told each step's commit: PowerSGD keeps only what committed
        self.in_step, self.quorum_s, self.gathered = False, 0.0, False
        stop_before_join(self.close)  # the Manager's quorum thread would hold the script's end
        self.outcome: StepOutcome | None = None
        self.uncommitted = 0  # optimizer steps that did not commit
        self.attempts = Attempts()  # at each step number: the failed ones were the quorum's
        self.quorum = QuorumWatch()  # joins and leaves, as events for `fatpipe top`

    def begin(self) -> None:
        """The first forward of a step: join its quorum (once); before the first step, with every
        declared node that starts within GATHER_S."""
        if not self.in_step:
            waited = time.perf_counter()
            if self.gathered:
                join_quorum(self.manager)
            else:
                gather_quorum(self.manager, self.settings.nodes)
                self.gathered = True
            self.quorum_s, self.in_step = time.perf_counter() - waited, True

    def commit(self, optimizer: torch.optim.Optimizer, closure=None) -> bool:
        """optimizer.step() under live: only when every rank of the group and the quorum agree."""
        manager = self.manager
        if not self.in_step:
            raise RuntimeError("optimizer.step() under fault_tolerance = \"live\" needs a forward "
                               "pass of the model fatpipe.wrap() returned first")
        if not gradients_finite(self.module.parameters()):  # a garbled all-reduce
            manager.report_error(RuntimeError("non-finite gradient after the all-reduce"))
        participants, healed = manager.num_participants(), not manager.is_participating()
        self.attempts.begin(manager.current_step() + 1)
        committed = manager.should_commit()  # applies the live state a returning node was sent
        self.meter.settle(committed, healed)
        if committed:
            optimizer.step(closure)
        else:
            self.uncommitted += 1
            log.warning("step %d not committed: the quorum changed during it",
                        manager.current_step() + 1)
        self.in_step = False
        self.outcome = StepOutcome(committed, participants, healed, self.quorum_s,
                                   self.attempts.of(manager.current_step()))
        return committed

    def take_outcome(self) -> StepOutcome:
        """The last optimizer step's outcome, once (fatpipe.step after optimizer.step)."""
        outcome, self.outcome = self.outcome, None
        if outcome is None:
            raise RuntimeError("under fault_tolerance = \"live\" the optimizer steps through "
                               "fatpipe: optimizer = fatpipe.optimizer(optimizer)")
        return outcome

    def steps_done(self) -> int:
        return self.manager.current_step() if self.manager is not None else self.closed_at

    def summary(self, records: list[dict], tokens_per_step: int) -> dict:
        """What summary.json adds under live (`tokens_per_step`: one node's)."""
        nodes = self.settings.nodes
        return {"fault_tolerance": "live", "node": self.settings.replica_id,
                "world_size": nodes * self.world_size, **run_fields(records, nodes, tokens_per_step),
                "uncommitted_steps": self.uncommitted, "param_digest": param_digest(self.module)}

    def _state(self) -> dict:
        return {"model": self.module.state_dict(),
                "stateful": [s.state_dict() for s in self.stateful]}

    def _load(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        for target, saved in zip(self.stateful, state["stateful"], strict=True):
            target.load_state_dict(saved)

    def close(self) -> None:
        if self.manager is not None:
            manager, self.manager = self.manager, None
            self.closed_at = manager.current_step()  # what steps_done() says from here
            manager.shutdown(wait=False)

