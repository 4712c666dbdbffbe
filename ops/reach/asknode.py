"""One round trip per node per command: every check a command makes of a node, in one remote command.

docs/ARCHITECTURE.md, "Inside ops". A command builds its steps for each node (`Step`: a function
of a node-side module, its arguments, the folder it runs in), `ask` sends them with
`node/call.py` and those modules as the program of `python3 -c` (one argument, never shell
text nor a file on the node) and reads back one answer per step, all nodes at once with
`fan_out`. Node-side modules are standard library only; process identity, exit codes
and folders are read there by Python, not by shell text. A later stage of the same command that
needs an answer the first call already brought takes it with `recall` instead of asking again;
one that several launches of a command need (the environment's versions) is `keep`'s. Both live
in the command's `NodeAnswers`, which the cluster object holds and hands to every transport it
makes (ops/reach/cluster.py): no module state, so two commands in one process never share answers.
"""

from __future__ import annotations

import json
import shlex
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fatpipe.infra.errors import FatpipeError
from fatpipe.node import source_file

from .transport import Transport

NODE_PROGRAM = source_file("call")
MARK = "FATPIPE_NODECALL "
CALL_TIMEOUT_S = 120


@dataclass(frozen=True)
class Step:
    """`module.function(*args)` on the node, run from `cwd` (relative to the command's start:
    the login's home on ssh); `module` is the name of a source in `sources` (empty: node/call.py's own)."""

    call: str
    args: tuple = ()
    cwd: str = ""
    sources: tuple[tuple[str, Path], ...] = field(default=(), compare=False)

    def request(self) -> dict:
        return {"call": self.call, "args": list(self.args), "cwd": self.cwd}


class NodeCallError(FatpipeError):
    """The node program could not run or answer on a node (the node is out of reach, no python3)."""

    def __init__(self, transport: Transport, reason: str):
        super().__init__(f"{transport.describe()}: {reason}")
        self.reason = reason


def program(steps: list[Step]) -> str:
    """The program `python3 -c` runs: node/call.py, the modules the steps name, the request."""
    modules: dict[str, Path] = {}
    for step in steps:
        modules.update(dict(step.sources))
    loads = "".join(f"load({name!r}, {path.read_text()!r})\n" for name, path in modules.items())
    request = json.dumps([step.request() for step in steps])
    return f"{NODE_PROGRAM.read_text()}\n{loads}serve(json.loads({request!r}))\n"


def ask(transport: Transport, steps: list[Step], timeout: float = CALL_TIMEOUT_S) -> list[dict]:
    """Run `steps` on the node in one remote command; one answer per step (`{"ok": value}` or
    `{"error": text}`). Raises NodeCallError naming the node when no answer came back."""
    result = transport.run(f"python3 -c {shlex.quote(program(steps))}", timeout=timeout)
    lines = [line for line in result.stdout.splitlines() if line.startswith(MARK)]
    if not lines:
        raise NodeCallError(transport, result.reason())
    answers = json.loads(lines[-1][len(MARK):])
    if len(answers) != len(steps):
        raise NodeCallError(transport, f"{len(answers)} answer(s) to {len(steps)} check(s)")
    return answers


def step_value(answer: dict, what: str, transport: Transport):
    """The step's value, or FatpipeError naming the node and `what` failed there."""
    if "error" in answer:
        raise FatpipeError(f"{transport.describe()}: {what}: {answer['error']}")
    return answer.get("ok")


class NodeAnswers:
    """A command's node answers, the cluster's (ops/reach/cluster.py), keyed by (node, step).

    `brought`: what a command's first call brought for its later stages, each taken once.
    `kept`: answers kept across the launches of one command (`fatpipe up`: netcheck's launch,
    then the training's) while nothing changed on the node in between; None: not keeping.
    """

    def __init__(self):
        self.brought: dict[tuple[str, Step], dict] = {}
        self.kept: dict[tuple[str, Step], dict] | None = None
        self.lock = threading.Lock()

    @contextmanager
    def keeping(self):
        """Within it, `keep`'s answers serve every later launch of the command until `forget`/`drop_kept`."""
        self.kept = {}
        try:
            yield
        finally:
            self.kept = None

    def forget_all(self) -> None:
        """Drop every answer brought and not taken (a launch's end: they were its alone)."""
        with self.lock:
            self.brought.clear()


def answers_of(transport: Transport) -> NodeAnswers:
    """The answers of the cluster that made `transport`; one made alone keeps its own."""
    if transport.answers is None:
        transport.answers = NodeAnswers()
    return transport.answers


def ask_ahead(transport: Transport, steps: list[Step], timeout: float = CALL_TIMEOUT_S) -> None:
    """A command's first call to the node: every step's answer kept for the stage that needs it.
    A node that does not answer keeps nothing: each stage asks it again and says why it failed."""
    try:
        remember(transport, steps, ask(transport, steps, timeout))
    except NodeCallError:
        pass


def remember(transport: Transport, steps: list[Step], answers: list[dict]) -> None:
    cache = answers_of(transport)
    with cache.lock:
        for step, answer in zip(steps, answers, strict=True):
            cache.brought[(transport.describe(), step)] = answer


def recall(transport: Transport, step: Step) -> dict | None:
    """The answer the command's first call already brought for `step` on this node (once), else None."""
    cache = answers_of(transport)
    with cache.lock:
        return cache.brought.pop((transport.describe(), step), None)


def take_all(transport: Transport, call: str) -> list[tuple[Step, dict]]:
    """Every (step, answer) of `call` brought for this node and not yet taken; taken now."""
    where, cache = transport.describe(), answers_of(transport)
    with cache.lock:
        keys = [key for key in cache.brought if key[0] == where and key[1].call == call]
        return [(key[1], cache.brought.pop(key)) for key in keys]


def brought(transport: Transport, step: Step) -> bool:
    """Whether an earlier call of this command brought `step`'s answer on this node, still untaken."""
    cache = answers_of(transport)
    with cache.lock:
        return (transport.describe(), step) in cache.brought


def forget(transport: Transport) -> None:
    """Drop what the first call brought (or `keeping` kept) for this node: its answers changed since."""
    where, cache = transport.describe(), answers_of(transport)
    drop_kept(transport)
    with cache.lock:
        for key in [key for key in cache.brought if key[0] == where]:
            del cache.brought[key]


def keep(transport: Transport, step: Step, answer: dict) -> None:
    cache = answers_of(transport)
    with cache.lock:
        if cache.kept is not None and "error" not in answer:
            cache.kept[(transport.describe(), step)] = answer


def kept(transport: Transport, step: Step) -> dict | None:
    """The answer `keep` kept for `step` on this node in this command, else None."""
    cache = answers_of(transport)
    with cache.lock:
        return None if cache.kept is None else cache.kept.get((transport.describe(), step))


def drop_kept(transport: Transport) -> None:
    """Drop what `keep` kept for this node (something it answered about has changed)."""
    where, cache = transport.describe(), answers_of(transport)
    with cache.lock:
        for key in [key for key in cache.kept or {} if key[0] == where]:
            del cache.kept[key]


def answer_of(transport: Transport, step: Step, timeout: float = CALL_TIMEOUT_S) -> dict:
    """`step`'s answer: the one already brought or kept, else asked now (a round trip of its own)."""
    return recall(transport, step) or kept(transport, step) or ask(transport, [step], timeout)[0]
