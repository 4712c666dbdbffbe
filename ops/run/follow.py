"""Follow a run's nodes from this machine: a view of the run that reconnects, never its lifeline.

Each node's log is streamed from the byte offset already passed to the sink, so a dropped
connection (a laptop asleep, a changed network, an idle NAT timeout, a killed ssh) is resumed
with no line lost or printed twice: only complete lines count, a partial last line is read
again. A node has ended only when the node says so: its exit file (written by its wrapper), or
its process gone without one (lost). A node that cannot be reached has not ended; past
`unreachable_s` out of reach (counted from the last contact: a stream that connects again is
contact, even on a quiet log) the follow gives up (NodesUnreachable) and the run goes on on its
nodes (docs/ARCHITECTURE.md, "A run lives on its nodes"), unless a live run went on without it
(`liveleave`): then it left, and the run ends with the others. Once a node has failed, a
restart run cannot finish (the node count is fixed): its peers get `fail_grace_s` to print
their own errors, then they are stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from fatpipe.infra.defaults import UNREACHABLE_TIMEOUT_S

from ..rdzv.noderun import UNFOLLOWED, NodeRun, Sink
from ..reach.transport import fan_out
from .liveleave import ended_without, mark_leaves

FAIL_GRACE_S = 10
LIVE_LOST_S = 30  # live: a node out of reach this long after its peers ended is not waited for
BACKOFF_S = (1, 2, 4, 8, 15)  # between reconnections; the last one repeats
LOST_RECHECK_S = 1.0  # a wrapper that exits just after the status read its exit file: ask again
CHUNK = 65536
DRAIN_TRIES = 5
REACHED = b"--fatpipe-follow--"  # a stream's first line: the node's shell answered


class NodesUnreachable(Exception):
    """The follow gave up: these nodes stayed out of reach longer than the bound; the run goes on."""

    def __init__(self, nodes: list[str], seconds: float, codes: dict[str, int | None]):
        super().__init__(f"{', '.join(nodes)} could not be reached for {seconds:g} s")
        self.nodes, self.seconds, self.codes = nodes, seconds, codes


@dataclass(frozen=True)
class NodeEnd:
    """What a node says about its run: `ended` with its recorded status (None: lost, or never
    started), else `running` or `unreachable` (with why)."""

    state: str  # ended | running | unreachable
    code: int | None = None
    why: str = ""

    @property
    def ended(self) -> bool:
        return self.state == "ended"


def read_end(node: NodeRun, timeout: float = 30) -> NodeEnd:
    """Ask the node how its run stands. A transport that fails is `unreachable`, never an end."""
    return settle(node, node.status(timeout=timeout), timeout)


def settle(node: NodeRun, text: str, timeout: float = 30) -> NodeEnd:
    """The node's end from the state it answered (`text`), asking once more after a `lost`."""
    if text.lstrip("-").isdigit():
        return NodeEnd("ended", int(text))
    if text == "lost":  # the process vanished; a wrapper exiting right now may not have: again
        time.sleep(LOST_RECHECK_S)
        again = node.status(timeout=timeout)
        if again.lstrip("-").isdigit():
            return NodeEnd("ended", int(again))
        return NodeEnd("ended", None) if again == "lost" else read_state(again)
    return read_state(text)


def read_state(text: str) -> NodeEnd:
    if text.lstrip("-").isdigit():
        return NodeEnd("ended", int(text))
    if text == "running":
        return NodeEnd(text)
    if text == "not-started":  # no process ever recorded there (a start refused): it will not end
        return NodeEnd("ended", None, why="never started")
    return NodeEnd("unreachable", why=text.removeprefix("unreachable: "))


class LogView:
    """One node's log as this machine has shown it: the bytes already passed to the sink."""

    def __init__(self, node: NodeRun, sink: Sink | None, halt: threading.Event):
        self.node, self.sink, self.halt = node, sink, halt
        self.offset = 0  # bytes of the node's log passed to the sink, whole lines only
        self.proc: subprocess.Popen | None = None
        self.unreachable_since: float | None = None  # monotonic, since the last contact
        self.unreachable_at: float | None = None  # the same moment, wall time
        self.left: dict | None = None  # a live run went on without it (liveleave)
        self.end: NodeEnd | None = None

    def reached(self) -> None:
        """The node answered: whatever time out of reach it had is over."""
        self.unreachable_since = self.unreachable_at = self.left = None

    def out_of_reach(self) -> None:
        if self.unreachable_since is None:
            self.unreachable_at, self.unreachable_since = time.time(), time.monotonic()

    def stream(self) -> None:
        """Stream the log from `offset` until the node's process has exited or the connection
        dropped. A partial last line is kept back: read again next time, or with the end."""
        # A marker first: a stream that connected is contact, though the log says nothing.
        command = f"echo {REACHED.decode()}; {self.node.follow_command(True, self.offset)}"
        # ssh's own complaints go nowhere: they must never pass for lines of the log.
        self.proc = proc = subprocess.Popen(
            self.node.transport.argv(command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True)
        if self.halt.is_set():  # halted while this stream was starting: kill() did not see it
            proc.kill()
        pending, first = b"", True
        try:
            while chunk := proc.stdout.read1(CHUNK):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if first:
                        first = False
                        if line == REACHED:
                            self.reached()
                            continue
                    self.show(line)
                    self.offset += len(line) + 1
        finally:
            proc.stdout.close()
            proc.wait()

    def show_rest(self, rest: str | None) -> bool:
        """Show the log's rest read with the node's end (the final read: a last line without a
        newline is whole); whether there was one to show (None: it could not be read)."""
        if rest is None:
            return False
        lines = rest.split("\n")
        for line in lines if lines[-1] else lines[:-1]:
            self.show(line.encode())
        self.offset += len(rest.encode())
        return True

    def show(self, line: bytes) -> None:
        # Once halted nothing more is shown, even lines already read: whatever the caller does
        # next (stopping the nodes, their tracebacks) is never printed as the run's output.
        if self.sink is None or self.halt.is_set():
            return
        try:
            self.sink(self.node.name, line.decode(errors="replace").rstrip("\r"))
        except Exception:  # noqa: BLE001 - whoever read our output went away: follow on, quietly
            self.sink = None

    def watch(self) -> None:
        """Follow until the node's end is known and its whole log shown (or the follow halts)."""
        tries = drains = 0
        while not self.halt.is_set():
            before = self.offset
            try:
                self.stream()
                if self.halt.is_set():
                    return
                # The node's end and the rest of its log, in one call; a node that answers its
                # status but not its log (its folder gone) ends without it.
                state, rest = self.node.end_and_rest(self.offset)
                end = settle(self.node, state)
                drains += end.ended
                if end.ended and (self.show_rest(rest) or drains >= DRAIN_TRIES):
                    self.reached()
                    self.end = end
                    return
            except Exception as e:  # noqa: BLE001 - this machine failed (a process limit, a sink):
                end = NodeEnd("unreachable", why=str(e))  # never a node's end, try again
            if self.halt.is_set():
                return
            if end.state == "unreachable":
                self.out_of_reach()
            else:
                self.reached()
            tries = 0 if self.offset > before else tries + 1
            self.halt.wait(BACKOFF_S[min(tries, len(BACKOFF_S) - 1)] if tries else 0.2)

    def kill(self) -> None:
        """End the stream and whatever it started here (its own session: a wrapper's children
        would hold the pipe open)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def stop_nodes(nodes: list[NodeRun]) -> dict[str, str]:
    """Signal every node's process group, wait for torchrun to wind down, kill what is left; each
    node's run state after, read in the same round trip."""
    return dict(zip([n.name for n in nodes], fan_out(lambda n: n.stop_and_status(), nodes), strict=True))


def follow_nodes(nodes: list[NodeRun], sink: Sink | None, timeout_s: float | None = None,
                 fail_grace_s: float | None = FAIL_GRACE_S, stopped: list[str] | None = None,
                 unreachable_s: float = UNREACHABLE_TIMEOUT_S, live: bool = False,
                 left: dict[str, dict] | None = None) -> dict[str, int | None]:
    """Stream every node's log to `sink` until every node has ended; {node: exit status, None
    for a lost node}.

    When one node fails, the others get `fail_grace_s` to finish before they are stopped; their
    names are appended to `stopped`. Raises TimeoutError past `timeout_s` (the caller stops the
    nodes), NodesUnreachable when a node stays out of reach past `unreachable_s` (nothing is
    stopped: the run goes on). Under live fault tolerance (`live`) the run goes on without a
    lost node, so a failed node stops nobody; a node out of reach past the bound that the nodes
    in reach went on without has left (in `left`: the step and time, liveleave) and is not
    waited for; once a node finished the run, one out of reach for LIVE_LOST_S (or the bound)
    is not waited for either: it counts as lost.
    """
    if live:
        fail_grace_s = None
    halt = threading.Event()
    views = [LogView(n, sink, halt) for n in nodes]
    threads = [threading.Thread(target=v.watch, daemon=True, name=f"follow-{v.node.name}") for v in views]
    deadline = time.monotonic() + timeout_s if timeout_s else None
    failed_at, stopping = None, False
    try:  # an interrupt as soon as one follower runs halts them all: none prints past the stop
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            time.sleep(0.2)
            now = time.monotonic()
            if deadline and now > deadline:
                raise TimeoutError(f"the run did not finish within {timeout_s:g} s")
            if live and ended_without(views, now, min(LIVE_LOST_S, unreachable_s)):
                break  # the ones out of reach are left as lost: the run ended without them
            away = [v for v in views if v.left is None and v.unreachable_since
                    and now - v.unreachable_since > unreachable_s]
            if away and live:
                away = mark_leaves(views, away)
            if away:
                raise NodesUnreachable([v.node.name for v in away], unreachable_s, known(views))
            if failed_at is None and any(v.end and v.end.code != 0 for v in views):
                failed_at = now
            if failed_at and fail_grace_s is not None and not stopping and now - failed_at > fail_grace_s:
                stopping = True
                going = [v.node for v in views if v.end is None]
                if stopped is not None:
                    stopped.extend(n.name for n in going)
                threading.Thread(target=stop_nodes, args=(going,), daemon=True).start()
    finally:
        halt.set()
        for view in views:
            view.kill()
        for thread in threads:
            if thread.ident is not None:  # started
                thread.join(timeout=5)
    if left is not None:
        left.update({v.node.name: v.left for v in views if v.left and not v.end})
    return {v.node.name: v.end.code if v.end else None for v in views}


def known(views: list[LogView]) -> dict[str, int | None]:
    """The ends known so far: {node: status, None for lost}."""
    return {v.node.name: v.end.code for v in views if v.end}


def still_going(nodes: list[NodeRun]) -> list[str]:
    """The nodes whose run may still be going: those that say so, and those out of reach."""
    ends = fan_out(read_end, nodes)
    return [n.name for n, end in zip(nodes, ends, strict=True) if end.state in ("running", "unreachable")]


def unfollowed_line(run_id: str, cluster: str, unknown: dict[str, str], code: int = UNFOLLOWED) -> str:
    """The one line for a follow that gave up (`unknown`: {node: "unreachable" | "running"}):
    who could not be reached, and that the run goes on there."""
    away = [n for n, state in unknown.items() if state == "unreachable"] or list(unknown)
    return (f"stopped following (exit {code}): {', '.join(away)} could not be reached; run {run_id} "
            f"goes on on its nodes: `fatpipe logs {cluster} -f` reattaches, `fatpipe stop {cluster}` ends it")
