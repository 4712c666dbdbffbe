"""A node's way to the run's Lighthouse: a TCP relay on loopback that forwards the node's torchft
Manager to the first Lighthouse, in the cluster's node order, that takes connections.

Every node of a run of 3 or more runs a Lighthouse (docs/ARCHITECTURE.md, "Live fault
tolerance"): node 0's serves while it is up; when it stops taking connections (its node died, its
link is cut) the relays move their Managers to node 1's, and back once node 0's takes connections
again. A Lighthouse holds no training state, only its quorums' numbering and the last quorum,
which the next one starts anew: so a Manager asks the relay which Lighthouse it forwards to
(`ASK`), and acts on a quorum id of its own derived from that (`live.epochs`). Two Lighthouses
may serve at once (a node cut off from node 0 but not from node 1); what keeps the nodes from
training as two runs is that a step commits only after an all-reduce across every member of
its quorum, a majority of the nodes (docs/ARCHITECTURE.md, "Live fault tolerance").

The Manager's gRPC channel reconnects by itself; moving it means closing its connection here.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

log = logging.getLogger("fatpipe.relay")

CHECK_S = 0.5  # how often every Lighthouse's port is tried
CONNECT_TIMEOUT_S = 1.0  # a cut link answers no SYN: its try fails after this
DOWN_CHECKS = 2  # failed tries in a row before the serving Lighthouse counts as gone
BACK_CHECKS = 3  # good tries in a row before an earlier Lighthouse is moved back to
CHOICE_WAIT_S = 10.0  # how long a new connection waits for some Lighthouse to take connections
# A Manager's question, on a connection of its own: which Lighthouse is forwarded to (gRPC's
# preface begins otherwise). Answered with {"lighthouse": "IP:PORT" or null, "switches": N}.
ASK = b"GET /fatpipe/relay "
HEAD_WAIT_S = 0.5  # a client that says nothing first (not gRPC) is forwarded after this


@dataclass
class Health:
    """Consecutive good and failed connection tries of one Lighthouse."""

    good: int = 0
    failed: int = 0

    def record(self, ok: bool) -> None:
        self.good, self.failed = (self.good + 1, 0) if ok else (0, self.failed + 1)


def choose(health: list[Health], current: int | None) -> int | None:
    """Which Lighthouse to serve through: the current one while it has not failed DOWN_CHECKS
    tries in a row, unless an earlier one has taken BACK_CHECKS in a row; else the first one
    that took its last try; None while none does."""
    if current is not None and health[current].failed < DOWN_CHECKS:
        earlier = [i for i in range(current) if health[i].good >= BACK_CHECKS]
        return earlier[0] if earlier else current
    up = [i for i, h in enumerate(health) if h.good >= 1]
    return up[0] if up else None


@dataclass
class Relay:
    """Listens on `listen` (host, port); forwards each connection to `lighthouses[current]`."""

    listen: tuple[str, int]
    lighthouses: list[tuple[str, int]]
    health: list[Health] = field(init=False)
    current: int | None = None
    switches: int = 0  # changes of `current`: an answer to ASK tells a Manager whether it moved
    _pipes: set[asyncio.Task] = field(default_factory=set)
    _chosen: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.health = [Health() for _ in self.lighthouses]

    async def serve(self, ready: asyncio.Event | None = None) -> None:
        server = await asyncio.start_server(self._accept, *self.listen)
        if ready is not None:
            ready.set()
        async with server:
            await self._watch()

    async def _watch(self) -> None:
        while True:
            results = await asyncio.gather(*(_takes_connections(a) for a in self.lighthouses))
            for health, ok in zip(self.health, results, strict=True):
                health.record(ok)
            self._switch(choose(self.health, self.current))
            await asyncio.sleep(CHECK_S)

    def _switch(self, chosen: int | None) -> None:
        if chosen == self.current:
            return
        previous, self.current, self.switches = self.current, chosen, self.switches + 1
        was = "" if previous is None else f" (was node {previous}'s)"
        if chosen is None:
            self._chosen.clear()
            log.warning("relay: no Lighthouse takes connections%s", was)
        else:
            self._chosen.set()
            host, port = self.lighthouses[chosen]
            log.warning("relay: the Lighthouse of node %d at %s:%d serves%s", chosen, host, port, was)
        if previous is not None:  # each Manager reconnects, through the new choice
            for pipe in list(self._pipes):
                pipe.cancel()

    def answer(self) -> bytes:
        """The reply to ASK: the Lighthouse forwarded to now, and the switches so far."""
        host, port = self.lighthouses[self.current] if self.current is not None else (None, 0)
        serving = f"{host}:{port}" if host else None
        body = json.dumps({"lighthouse": serving, "switches": self.switches}).encode()
        return b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + body

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._pipes.add(task)
        try:
            head = await _head(reader)
            if head.startswith(ASK):
                writer.write(self.answer())
                await writer.drain()
                return
            await asyncio.wait_for(self._chosen.wait(), CHOICE_WAIT_S)
            if self.current is None:  # gone again while this connection waited
                return
            host, port = self.lighthouses[self.current]
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
            try:
                up_writer.write(head)
                await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
            finally:
                up_writer.close()
        except (OSError, asyncio.TimeoutError, asyncio.CancelledError):
            pass  # the Manager's channel tries again
        finally:
            self._pipes.discard(task)
            writer.close()


async def _head(reader: asyncio.StreamReader) -> bytes:
    """A connection's first bytes: as many as tell ASK from anything else (gRPC's 24-byte preface
    comes at once, before any answer), or what came in HEAD_WAIT_S."""
    head, loop = b"", asyncio.get_running_loop()
    deadline = loop.time() + HEAD_WAIT_S
    while len(head) < len(ASK) and ASK.startswith(head):
        try:
            data = await asyncio.wait_for(reader.read(len(ASK) - len(head)),
                                          max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            break
        if not data:
            break
        head += data
    return head


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        if writer.can_write_eof():
            writer.write_eof()


async def _takes_connections(address: tuple[str, int]) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(*address), CONNECT_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    return True


def run_relay(listen: tuple[str, int], lighthouses: list[tuple[str, int]]) -> None:
    """Serve until the process ends (in a thread of the Lighthouse's process)."""
    asyncio.run(Relay(listen, lighthouses).serve())
