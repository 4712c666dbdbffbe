"""What ends a follow (ops.run.follow, ops.run.liveleave): only time a node is really out of reach
counts toward the bound, and under live a node that the run went on without is no reason to stop
following: the run ends with the others. A node still in the quorum, or every node out of reach,
still ends the follow (exit 75, the run goes on). Stand-in scripts on local "nodes" behind gate
files (test_follow's), writing step records as the live trainer does; no torch.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from fatpipe.cli.render import summary_table
from fatpipe.ops.rdzv.noderun import LaunchResult
from fatpipe.ops.run.follow import NodesUnreachable, follow_nodes
from fatpipe.ops.run.liveleave import leave_lines, went_on_without
from fatpipe.ops.run.summary import run_summary
from fatpipe.trainer.metrics import read_metrics

from .test_follow import gated_run, start

pytestmark = pytest.mark.timeout(120)

# A live node's steps: each one's record in the node's own folder, with the replica groups that
# made it: 3, or 2 once node 2 is cut off (`left` 1) or always 3 (`left` 0: it trains on).
LIVE_STEPS = ('mkdir -p {folder}; for i in $(seq 1 {n}); do p=3; [ {left} = 1 ] && [ -e {gate} ] && p=2; '
              'printf \'{{"step": %d, "participants": %d, "healed": false, "time": %s}}\\n\' '
              '$i $p $(date +%s.%N) >> {folder}/metrics.jsonl; echo "step $i"; sleep 0.1; done\n')


def live_run(folder: Path, steps: int, left: int) -> list:
    run = folder / "runs/r1"
    scripts = [LIVE_STEPS.format(folder=run if rank == 0 else run / f"live-node-{rank}", n=steps,
                                 left=left, gate=folder / "gate-2") for rank in (0, 1)]
    return gated_run(folder, [*scripts, "sleep 60\n"])  # node 2 says nothing


def stop_all(folder: Path, nodes: list) -> None:
    for gate in folder.glob("gate-*"):
        gate.unlink()
    for node in nodes:
        node.transport.run(node.stop_command(), timeout=40)


def cut_after(folder: Path, rank: int, lines: list, step: str) -> threading.Thread:
    """Cut node `rank` off once node 0 has shown `step`."""
    def cut() -> None:
        deadline = time.monotonic() + 30
        while (("n0", step) not in lines) and time.monotonic() < deadline:
            time.sleep(0.02)
        (folder / f"gate-{rank}").touch()

    thread = threading.Thread(target=cut, daemon=True)
    thread.start()
    return thread


def test_a_live_run_goes_on_past_the_bound_without_a_node_it_left_and_ends_with_the_others(tmp_path):
    """...but not without one still in its quorum, nor when every node is out of reach."""
    gives_up_unless_it_left(tmp_path / "kept")
    nodes = live_run(tmp_path, 60, left=1)
    start(nodes)
    lines: list[tuple[str, str]] = []
    cut = cut_after(tmp_path, 2, lines, "step 5")
    left: dict[str, dict] = {}
    try:
        codes = follow_nodes(nodes, lambda n, line: lines.append((n, line)), timeout_s=90,
                             unreachable_s=2, live=True, left=left)
    finally:
        cut.join(timeout=10)
        stop_all(tmp_path, nodes)
    assert codes == {"n0": 0, "n1": 0, "n2": None}
    fell = {next(r["step"] for r in read_metrics(folder / "metrics.jsonl") if r["participants"] == 2)
            for folder in (tmp_path / "runs/r1", tmp_path / "runs/r1/live-node-1")}
    assert list(left) == ["n2"] and left["n2"]["step"] in fell, (left, fell)  # where the groups fell to 2
    assert ("n0", "step 60") in lines  # followed to the others' end, well past the bound
    assert LaunchResult("r1", tmp_path, codes, live=True, left=left).exit_code == 0
    (line,) = leave_lines(codes, left)
    assert line.startswith(f"n2 left the run at step {left['n2']['step']} ("), line
    # `up`'s summary names it too.
    doc = {**run_summary(tmp_path / "runs/r1", 1.0), "left": left}
    console = Console(width=200, record=True)
    console.print(summary_table(doc))
    row = next(line for line in console.export_text().splitlines() if "left the run" in line)
    assert f"n2 at step {left['n2']['step']} (" in row, row


def gives_up_unless_it_left(tmp_path: Path) -> None:
    # n2 out of reach of this machine only: its peers' steps still count 3 groups.
    nodes = live_run(tmp_path, 300, left=0)
    start(nodes)
    lines: list[tuple[str, str]] = []
    cut = cut_after(tmp_path, 2, lines, "step 5")
    try:
        with pytest.raises(NodesUnreachable) as gave_up:
            follow_nodes(nodes, lambda n, line: lines.append((n, line)), timeout_s=60, unreachable_s=2,
                         live=True)
        assert gave_up.value.nodes == ["n2"]
        # Every node out of reach: nobody can tell, the follow ends and the run goes on.
        for rank in (0, 1):
            (tmp_path / f"gate-{rank}").touch()
        with pytest.raises(NodesUnreachable) as gave_up:
            follow_nodes(nodes, None, timeout_s=60, unreachable_s=2, live=True)
        # (Whichever node passes the bound first under load ends it: the others may be inside it.)
        assert gave_up.value.nodes and set(gave_up.value.nodes) <= {"n0", "n1", "n2"}
    finally:
        cut.join(timeout=10)
        stop_all(tmp_path, nodes)


def test_a_stream_that_connects_again_clears_the_unreachable_clock_though_the_log_is_quiet(tmp_path):
    # Out of reach for a second, then quiet for longer than the bound: only the cut counts.
    (node,) = gated_run(tmp_path, ["echo started; sleep 8; echo done\n"])
    start([node])
    lines: list[tuple[str, str]] = []

    def cut() -> None:
        deadline = time.monotonic() + 30
        while not lines and time.monotonic() < deadline:
            time.sleep(0.02)
        (tmp_path / "gate-0").touch()
        time.sleep(0.8)  # the first reconnection, a second after the cut, finds it back
        (tmp_path / "gate-0").unlink()

    thread = threading.Thread(target=cut, daemon=True)
    thread.start()
    try:
        codes = follow_nodes([node], lambda n, line: lines.append((n, line)), timeout_s=90,
                             unreachable_s=4)
    finally:
        thread.join(timeout=10)
        stop_all(tmp_path, [node])
    assert codes == {"n0": 0}
    assert [line for _, line in lines] == ["started", "done"]


def rec(step: int, groups: int, at: float, healed: bool = False) -> dict:
    return {"step": step, "participants": groups, "healed": healed, "time": at}


def test_the_run_left_a_node_only_when_every_group_of_a_step_since_is_in_reach():
    before = [rec(s, 3, 100 + s) for s in range(1, 6)]
    without = [rec(s, 2, 100 + s) for s in range(6, 11)]
    two = [before + without, before + without[:-1]]  # the second node one step behind
    assert went_on_without(two, 104.5) == {"step": 6, "time": 106}
    assert went_on_without(two, 111) is None  # nothing committed since it went out of reach
    assert went_on_without([before, before], 100) is None  # 3 groups: it was in the quorum
    assert went_on_without([before + without], 104.5) is None  # 2 groups, 1 node in reach
    healing = [before + without, before + [{**r, "healed": True} for r in without]]
    assert went_on_without(healing, 104.5) is None  # a node being sent the state is no group
    alone = [before + [rec(s, 1, 100 + s) for s in range(6, 9)]]  # two nodes left at once
    assert went_on_without(alone, 104.5) == {"step": 6, "time": 106}
    assert went_on_without([[], []], 0) is None and went_on_without([], 0) is None
