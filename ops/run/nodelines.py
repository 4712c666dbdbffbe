"""What of the nodes' output the operator's terminal shows; each node's log keeps every line.

Third-party logging (torch's C++ and torchrun's warnings, torchft's Rust and Python logs, NCCL,
Python's warnings) and the live path's plumbing (which Lighthouse serves each node's relay) stay in the
node logs: a user can do nothing about them, and `-v` shows them. Under live every node is a
torchrun of its own whose rank 0 logs as a run's main rank does, so the step lines of one step
become one line for the cluster (the first node's line with the slowest node's sync, and the
nodes it heard from when fewer than all), and a line every node prints alike (the comm decision,
a quorum change, a step not committed) is shown once.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable

PY_WARNING = re.compile(r"^\S+\.py:\d+: \w*Warning: ")  # Python's; its source line follows, indented
THIRD_PARTY = re.compile(
    r"^\[?[IWEF]\d{4} \d\d:\d\d:\d\d"  # torch's C++ logging (c10d, gloo) and torchrun's agent
    r"|^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\S* \[(?:TRACE|DEBUG|INFO|WARN|ERROR)\] \["  # torchft's Rust
    r"|^\[trainer r\d+ \| "  # a library's Python logging in the trainer (trainer.nodelog)
    r"|\bNCCL (?:INFO|WARN)\b"
    r"|" + PY_WARNING.pattern)
PLUMBING = re.compile(r"^(?:lighthouse|relay): ")  # which Lighthouse serves: the node logs say
STEP = re.compile(r"^step (\d+)(?:/\d+)? loss .*? sync (\d+) ms ")
NODE_SUMMARY = re.compile(r"^\[trainer r\d+\] summary: ")
CLUSTER = "all"  # the label of a line that speaks for every node
REMEMBERED = 256  # lines every node prints alike, remembered to show once
WAIT_S = 5.0  # how long a step's cluster line waits for a node's line once a later step is in


class NodeLines:
    """Feed it each node's lines (`line`), then `flush` at the end; it calls `show(label, text)`."""

    def __init__(self, show: Callable[[str, str], None], nodes: list[str], live: bool,
                 verbose: bool = False, clock: Callable[[], float] = time.monotonic):
        self.show, self.nodes, self.live, self.verbose = show, list(nodes), live, verbose
        self.clock = clock
        self.present = set(self.nodes)  # nodes whose step lines a cluster line waits for
        self.steps: dict[int, dict[str, tuple[str, int]]] = {}  # step -> node -> (line, sync ms)
        self.first_seen: dict[int, float] = {}  # step -> when its first line came
        self.shown_step = 0
        self.alike: OrderedDict[str, set[str]] = OrderedDict()  # text -> nodes that printed it
        self.in_warning: set[str] = set()  # nodes whose last line was a Python warning

    def __call__(self, node: str, text: str) -> None:
        self.line(node, text)

    def line(self, node: str, text: str) -> None:
        if self.verbose:
            self.show(node, text)
        elif not self._third_party(node, text) and not (self.live and self._merged(node, text)):
            self.show(node, text)

    def flush(self) -> None:
        """The steps still waiting for a node's line: shown with the nodes heard from."""
        while self.steps:
            self._show_step(min(self.steps))

    def _third_party(self, node: str, text: str) -> bool:
        if node in self.in_warning and text[:1].isspace():
            return True  # the source line Python prints under a warning
        self.in_warning.discard(node)
        if THIRD_PARTY.search(text):
            if PY_WARNING.match(text):
                self.in_warning.add(node)
            return True
        return bool(PLUMBING.match(text))

    def _merged(self, node: str, text: str) -> bool:
        """True when the line is taken into a cluster line or was shown for another node."""
        step = STEP.match(text)
        if step:
            self._step(node, int(step[1]), text, int(step[2]))
            return True
        if NODE_SUMMARY.match(text):  # each node's closing line: the run's summary follows
            text = "node summary"
        printed = self.alike.get(text)
        if printed is not None and node not in printed:
            printed.add(node)
            return True
        self.alike[text] = {node}
        self.alike.move_to_end(text)
        if len(self.alike) > REMEMBERED:
            self.alike.popitem(last=False)
        return False

    def _step(self, node: str, step: int, text: str, sync_ms: int) -> None:
        self.present.add(node)  # a node that left and came back is waited for again
        if step <= self.shown_step:
            return  # its cluster line is out: a late node's line adds nothing now
        self.steps.setdefault(step, {})[node] = (text, sync_ms)
        self.first_seen.setdefault(step, self.clock())
        while self.steps:  # in order: a step waits for every node still present, or WAIT_S
            first = min(self.steps)
            complete = self.present <= set(self.steps[first])
            waited = len(self.steps) > 1 and self.clock() - self.first_seen[first] >= WAIT_S
            if not (complete or waited):
                break
            self._show_step(first)

    def _show_step(self, step: int) -> None:
        heard = self.steps.pop(step)
        self.first_seen.pop(step, None)
        self.shown_step = max(self.shown_step, step)
        self.present &= set(heard)  # a node silent that long has left the quorum (or lags)
        first = min(heard, key=lambda n: self.nodes.index(n) if n in self.nodes else len(self.nodes))
        slowest = max(sync for _, sync in heard.values())
        text = re.sub(r" sync \d+ ms ", f" sync {slowest} ms ", heard[first][0], count=1)
        if len(heard) < len(self.nodes):
            text += f" ({len(heard)} of {len(self.nodes)} nodes)"
        self.show(CLUSTER, text)
