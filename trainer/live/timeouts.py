"""How long the replica groups wait while one is sent the live state (docs/ARCHITECTURE.md, "Live
fault tolerance", timeouts).

A returning group (and, at a script's first quorum, every group but one) is sent the model and
optimizer by a peer over torchft's HTTP transport, in the step it joins at. The others wait for
it in that step's all-reduce, and the group that sends waits at `should_commit` until the
transfer has ended (torchft's transport lock). With the floors alone (6 s) a state that takes
longer to send (GPT-2 124M with AdamW: 1.5 GB, 12 s at 1 Gbit/s) fails the others' step, then
raises out of the sender's `should_commit`. So in a quorum where a group heals every timeout is
its floor plus HEAL_MARGIN times the transfer's time over the link (the lower of the declared
tier and the rate measured on the live all-reduces); in every other quorum the floors, so a cut
link still costs seconds.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta

# Over the link's rate: one HTTP stream whose bytes Python serializes, a link shared by the
# ranks' copies, a rate measured a while before.
HEAL_MARGIN = 3.0
LINK_WINDOW = 8  # the last all-reduces the measured rate is taken over
DEFAULT_LINK_GBPS = 1.0  # neither declared nor measured: the lowest tier


def heal_timeout_s(nbytes: int, link_gbps: float, floor_s: float) -> float:
    """A timeout that outlasts sending `nbytes` over a link of `link_gbps`: never below the floor,
    in whole seconds (a socket's timeout reads back exactly, as torchft's server asserts)."""
    return floor_s + math.ceil(HEAL_MARGIN * nbytes * 8 / (link_gbps * 1e9))


def state_bytes(state) -> int:
    """The bytes of every tensor in a nested state (dicts, lists, tuples)."""
    if hasattr(state, "element_size") and hasattr(state, "numel"):  # a tensor (no torch import)
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def heal_copies(quorum, init_sync: bool) -> int:
    """Copies of the state the busiest sending group's link carries in this quorum (torchft
    spreads the healing groups over the groups at the quorum's step, round robin): 0 when no
    group heals. `quorum`: torchft's quorum result."""
    groups, current = quorum.replica_world_size, quorum.max_world_size
    if init_sync and quorum.max_step == 0:
        current = 1  # a script's first quorum: every group is sent one group's state
    healing = groups - current
    return -(-healing // max(current, 1)) if healing > 0 else 0


class LinkRate:
    """The live all-reduces' rate outside heals: their bytes over their seconds, the last
    LINK_WINDOW of them (each includes its wait for the slowest group: the rate errs low)."""

    def __init__(self):
        self._seen: deque[tuple[int, float]] = deque(maxlen=LINK_WINDOW)
        self.paused = False  # in a heal's quorum the all-reduce waits for the transfer

    def observe(self, nbytes: int, seconds: float) -> None:
        if not self.paused and seconds > 0:
            self._seen.append((nbytes, seconds))

    def gbps(self) -> float | None:
        if not self._seen:
            return None
        return sum(b for b, _ in self._seen) * 8 / sum(s for _, s in self._seen) / 1e9


@dataclass
class HealTimeouts:
    """One replica group's timeouts, set at each quorum: the floors, or a heal's."""

    manager: object  # torchft's Manager
    collective_s: float  # the floors (live.manager.LiveSettings)
    quorum_s: float
    tier_gbps: float | None  # the cluster's declared tier
    ranks: int  # the group's ranks: each one is sent a copy over the node's link
    link: LinkRate = field(default_factory=LinkRate)

    def link_gbps(self) -> float:
        rates = [r for r in (self.tier_gbps, self.link.gbps()) if r]
        return min(rates) if rates else DEFAULT_LINK_GBPS

    def apply(self, copies: int) -> float:
        """Set the timeouts for a quorum whose busiest link carries `copies` of the state (0: the
        floors); returns the collective timeout."""
        seconds = self.collective_s
        if copies:
            nbytes = state_bytes(self.manager._manager_state_dict()) * copies * self.ranks
            seconds = heal_timeout_s(nbytes, self.link_gbps(), self.collective_s)
        self.link.paused = bool(copies)
        set_timeouts(self.manager, seconds, self.quorum_s + seconds - self.collective_s)
        return seconds


def set_timeouts(manager, collective_s: float, quorum_s: float) -> None:
    """torchft 0.2.0's timeouts, between a quorum's result and the group it configures."""
    manager._timeout = timedelta(seconds=collective_s)  # should_commit; the state's RPC and HTTP
    manager._pg.set_timeout(timedelta(seconds=collective_s))  # each all-reduce (live.manager)
    manager._quorum_timeout = timedelta(seconds=quorum_s)  # the next quorum's request
    transport = manager._checkpoint_transport
    transport._checkpoint_lock.timeout = collective_s  # should_commit waits for a send to end
    transport._server.RequestHandlerClass.timeout = collective_s  # one tensor's sendall


def allreduce_timed(manager, link: LinkRate | None, tensor, **kwargs) -> None:
    """`manager.allreduce(tensor, **kwargs)`, waited for; its rate told to `link` unless it
    failed (an errored Manager returns at once), when the group is dropped (`drop_failed_group`)."""
    start = time.perf_counter()
    manager.allreduce(tensor, **kwargs).wait()
    if manager.errored() is not None:
        drop_failed_group(manager)
    elif link is not None:
        link.observe(tensor.numel() * tensor.element_size(), time.perf_counter() - start)


def drop_failed_group(manager) -> None:
    """Close the cross-node gloo group whose exchange just failed here (a peer died, a link was
    cut), so every peer's exchange fails within milliseconds: gloo fails a pending receive only
    when its own connection breaks, so a group that is no neighbour of the dead one in the ring
    waited out the collective timeout (6 s; bench/faults.py measured it). Its connections close
    when nothing holds gloo's context any more: torchft's wrapper forgets the group on `abort`
    (the next quorum configures a new one, as it would have), and the failed work lives on only
    in the frames of the error torchft keeps, which are let go (its text keeps the trace)."""
    error = manager.errored()
    chain = [error, getattr(error, "original_exception", None)]
    while chain[-1] is not None and len(chain) < 10:  # and what it was raised from
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    for raised in filter(None, chain):
        raised.__traceback__ = None
    manager._pg.abort()
