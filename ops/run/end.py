"""How a run already under way or over ended, told after the fact (`fatpipe logs`), as a
followed launch tells it when it ends: each node's exit status and the nodes fatpipe stopped.

A node's `node-<rank>.exit` in the run folder here is final (written by its wrapper, on a sim
node directly, on an ssh node pulled back); a node without one is asked. The `node-<rank>.stop`
marker is what `fatpipe stop` (and a launch stopping the others after one failed) leaves before
it signals the node: a node with one did not fail on its own.
"""

from __future__ import annotations

from pathlib import Path

from fatpipe.infra.runinfo import recorded_exits

from ..rdzv.noderun import LaunchResult, NodeRun, node_states, state_of
from ..reach.asknode import NodeCallError, ask
from ..reach.transport import fan_out


def read_logs(nodes: list[NodeRun]) -> dict[str, tuple[str, str | None]]:
    """{node: (its run state, its log or None)} of the nodes that answer, one round trip each,
    all at once: what `fatpipe logs` reads of a node."""
    def read(node: NodeRun):
        try:
            state, text = ask(node.transport, [node.status_step(), node.log_step()])
        except NodeCallError:
            return None
        return (state_of(state), text.get("ok")) if "error" not in text else None

    answers = dict(zip([n.name for n in nodes], fan_out(read, nodes), strict=True))
    return {name: answer for name, answer in answers.items() if answer is not None}


def node_exits(run_dir: Path, nodes: list[NodeRun], gone: set[str],
               read: dict[str, tuple[str, str | None]] | None = None) -> dict[str, int | None] | None:
    """{node: exit status, None when its process was lost}, or None while the run is not over
    (a node still running it, not started, or not answering). `gone` nodes (a sim cluster
    taken down) are not asked: their folder here is all there is, nor those whose state was
    `read` already (`read_logs`)."""
    read = read or {}
    recorded = recorded_exits(Path(run_dir))
    pending = [n for n in nodes if f"node-{n.plan.rank}" not in recorded and n.name not in gone]
    unread = [n for n in pending if n.name not in read]
    asked = {name: state for name, (state, _) in read.items()}
    asked.update(zip([n.name for n in unread], node_states(unread), strict=True))
    codes: dict[str, int | None] = {}
    for node in nodes:
        state = asked.get(node.name, "")
        if f"node-{node.plan.rank}" in recorded:
            codes[node.name] = recorded[f"node-{node.plan.rank}"]
        elif node.name in gone or state == "lost":
            codes[node.name] = None
        elif state.lstrip("-").isdigit():
            codes[node.name] = int(state)
        else:
            return None
    return codes


def ended_result(run_id: str, run_dir: Path, nodes: list[NodeRun], codes: dict[str, int | None]) -> LaunchResult:
    """The LaunchResult a followed launch would have had: `codes` with the stopped nodes, read
    in the run's own fault tolerance (a live run's end is its survivors')."""
    stopped = [n.name for n in nodes if (Path(run_dir) / f"node-{n.plan.rank}.stop").exists()]
    live = bool(nodes) and nodes[0].rdzv.live
    return LaunchResult(run_id, Path(run_dir), dict(codes), stopped=stopped, live=live)


def ended_note(result: LaunchResult) -> str:
    """How the run ended, in the phase table's few words: the nodes that exit 0 (under live a run
    that went on without a node says which, and how it ended), else why it did not end well."""
    if result.ok:
        codes = result.exit_codes
        passed = sum(1 for code in codes.values() if code == 0)
        if passed == len(codes):
            return f"all {passed} node(s) exit 0"
        without = ", ".join(f"{name} ({'lost' if code is None else f'exit {code}'})"
                            for name, code in codes.items() if code != 0)
        return f"{passed} of {len(codes)} node(s) exit 0; the run went on without {without}"
    if result.interrupted or result.timed_out:
        return "interrupted" if result.interrupted else "timed out"
    if result.failure:
        return result.failure
    if result.unknown:
        return "stopped following: " + ", ".join(f"{n} {s}" for n, s in result.unknown.items())
    return f"worst exit {result.exit_code}"


def stopped_by_fatpipe(result: LaunchResult) -> bool:
    """Whether every node that ended badly was stopped (`fatpipe stop`, a Ctrl-C, a timeout):
    a run ended so did not fail, and no failure line names a cause."""
    bad = [name for name, code in result.exit_codes.items() if code != 0]
    return bool(bad) and all(name in result.stopped for name in bad)
