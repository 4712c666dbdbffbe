"""The follower is a view of the run, never its lifeline (ops.run.follow): a dropped connection is
resumed from the byte offset already shown, an unreachable node is neither failed nor lost, the
follow gives up past its bound and stops nothing, and a failed run names the node that was lost
or failed first, never one fatpipe stopped. Stand-in scripts on local "nodes", no torch.

A node's connection is cut two ways: the follower's own process killed (a killed ssh), and a
gate file that makes every command on the node fail as ssh does when the node is out of reach
(status 255), and cuts a stream already running (a connection that drops).
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from pathlib import Path

import psutil
import pytest

from fatpipe.ops.rdzv.noderun import UNFOLLOWED, LaunchResult, NodeRun
from fatpipe.ops.reach.transport import LocalTransport
from fatpipe.ops.run.failure import describe_failure
from fatpipe.ops.run.follow import NodesUnreachable, follow_nodes, read_end
from fatpipe.ops.run.summary import no_steps_hint, run_summary

from .test_launch import fake_run

pytestmark = pytest.mark.timeout(120)


class GatedTransport(LocalTransport):
    """A local node that cannot be reached while `gate` exists: every command fails with ssh's
    status 255, and a command already running is cut off when the gate appears."""

    def __init__(self, name: str, gate: Path):
        super().__init__(name)
        self.gate = gate

    def argv(self, command: str) -> list[str]:
        gate = shlex.quote(str(self.gate))
        return ["bash", "-c", (
            f'[ -e {gate} ] && {{ echo "ssh: connect to host {self.node_name} port 22: Connection timed out" >&2; '
            "exit 255; }; "
            f"bash -c {shlex.quote(command)} & pid=$!; "
            f"while kill -0 $pid 2>/dev/null; do [ -e {gate} ] && {{ kill $pid; exit 255; }}; sleep 0.05; done; "
            "wait $pid")]


def gated_run(folder: Path, scripts: list[str]) -> list[NodeRun]:
    """test_launch's local nodes, each behind a gate file of its own (`gate-<rank>`)."""
    nodes = fake_run(folder, scripts)
    for i, node in enumerate(nodes):
        node.transport = GatedTransport(node.name, folder / f"gate-{i}")
    return nodes


def start(nodes: list[NodeRun]) -> None:
    for node in nodes:
        assert node.transport.run(node.start_command()).ok


def log_of(folder: Path, rank: int) -> list[str]:
    return (folder / "runs/r1" / f"node-{rank}.log").read_text().splitlines()


# Numbered lines, some written in two halves (a partial line is what a cut leaves pending).
STEPS = ('for i in $(seq 1 {n}); do printf "step %d of {n} " $i; sleep 0.02; echo "loss $i"; '
         "sleep {pause}; done\n")


def shown(lines: list[tuple[str, str]], node: str) -> list[str]:
    return [line for name, line in lines if name == node]


def followers() -> list[psutil.Process]:
    """The follow's streams of node logs (tail), children of this test's process."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "tail" in proc.name() and "-F" in proc.cmdline():
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


def test_a_killed_follower_resumes_where_it_was_no_line_lost_or_repeated(tmp_path):
    nodes = fake_run(tmp_path, [STEPS.format(n=60, pause=0.05), STEPS.format(n=40, pause=0.08)])
    start(nodes)
    lines: list[tuple[str, str]] = []
    done = threading.Event()

    def cut() -> None:  # kill every follower's process, again and again, while the run goes on
        while not done.wait(0.7):
            for proc in followers():
                proc.kill()

    cutter = threading.Thread(target=cut, daemon=True)
    cutter.start()
    try:
        codes = follow_nodes(nodes, lambda n, line: lines.append((n, line)), timeout_s=90)
    finally:
        done.set()
        cutter.join(timeout=10)
    assert codes == {"n0": 0, "n1": 0}
    for rank, node in enumerate(nodes):
        assert shown(lines, node.name) == log_of(tmp_path, rank)  # every line once, in order
    assert [n.status() for n in nodes] == ["0", "0"]


def test_an_unreachable_node_is_neither_failed_nor_lost_and_its_end_is_read_once_back(tmp_path):
    # n1 is cut off mid-run and its run ends while nothing can reach it; n0 finishes meanwhile.
    nodes = gated_run(tmp_path, [STEPS.format(n=10, pause=0.05), STEPS.format(n=30, pause=0.05)])
    start(nodes)
    lines: list[tuple[str, str]] = []
    gate = tmp_path / "gate-1"

    def partition() -> None:
        deadline = time.monotonic() + 30
        while len(shown(lines, "n1")) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        gate.touch()
        assert read_end(nodes[1]).state == "unreachable"
        while "loss 30" not in (tmp_path / "runs/r1/node-1.log").read_text() and time.monotonic() < deadline + 30:
            time.sleep(0.1)
        time.sleep(6)  # past the follow's first reconnection tries
        gate.unlink()

    cut = threading.Thread(target=partition, daemon=True)
    cut.start()
    codes = follow_nodes(nodes, lambda n, line: lines.append((n, line)), timeout_s=90, unreachable_s=60)
    cut.join(timeout=10)
    assert codes == {"n0": 0, "n1": 0}
    for rank, node in enumerate(nodes):
        assert shown(lines, node.name) == log_of(tmp_path, rank)
    assert not (tmp_path / "runs/r1/node-0.stop").exists()  # the healthy node was never stopped


def test_past_the_bound_the_follow_gives_up_and_the_run_goes_on(tmp_path):
    nodes = gated_run(tmp_path, [STEPS.format(n=400, pause=0.05), STEPS.format(n=400, pause=0.05)])
    start(nodes)
    (tmp_path / "gate-1").touch()
    try:
        with pytest.raises(NodesUnreachable) as gave_up:
            follow_nodes(nodes, None, timeout_s=60, unreachable_s=2)
        assert gave_up.value.nodes == ["n1"] and gave_up.value.codes == {}
        (tmp_path / "gate-1").unlink()
        assert [n.status() for n in nodes] == ["running", "running"]  # nothing was stopped
        assert not list((tmp_path / "runs/r1").glob("*.stop"))
    finally:
        (tmp_path / "gate-1").unlink(missing_ok=True)
        for node in nodes:
            node.transport.run(node.stop_command(), timeout=40)
    unknown = LaunchResult("r1", tmp_path, {"n0": 0}, unknown={"n1": "unreachable"})
    assert unknown.exit_code == UNFOLLOWED and not unknown.ok
    assert describe_failure(unknown, nodes[0].rdzv, 0) is None  # nothing failed that fatpipe saw
    failed = LaunchResult("r1", tmp_path, {"n0": 3}, unknown={"n1": "unreachable"})
    assert failed.exit_code == 3  # a failure already recorded says more than "still going"


def test_a_node_whose_processes_vanished_is_lost_first_and_the_one_fatpipe_stopped_is_not_named(tmp_path):
    # n1's whole process tree is killed at once; n0 would run on, waiting: fatpipe stops it.
    nodes = fake_run(tmp_path, ["echo waiting for n1; sleep 300\n", "echo step 1; sleep 300\n"])
    start(nodes)
    run = tmp_path / "runs/r1"
    (run / "metrics.jsonl").write_text("".join(json.dumps(
        {"step": s, "loss": 5.0 - s / 100, "step_s": 0.1, "sync_s": 0.01, "tokens_per_s": 1000.0,
         "wire_bytes": 10, "busbw_gbps": 0.5, "comm": "allreduce"}) + "\n" for s in range(1, 81))
        + '{"step": 81, "lo')  # the line a kill tore
    pid = int((run / "node-1.pid").read_text())

    def vanish() -> None:
        time.sleep(1)
        wrapper = psutil.Process(pid)
        for proc in [wrapper, *wrapper.children(recursive=True)]:  # the wrapper first: no exit file
            proc.kill()

    threading.Thread(target=vanish, daemon=True).start()
    stopped: list[str] = []
    codes = follow_nodes(nodes, None, timeout_s=90, fail_grace_s=1, stopped=stopped)
    assert codes["n1"] is None and stopped == ["n0"] and codes["n0"] not in (0, None)
    result = LaunchResult("r1", run, codes, stopped=stopped)
    line = describe_failure(result, nodes[0].rdzv, 0)
    assert line.startswith("n1 was lost after step 80: its processes vanished"), line
    assert "n0" not in line, line
    assert result.exit_code == 255
    # The summary is over the 80 steps recorded, not "no steps recorded".
    doc = run_summary(run, 1.0)
    assert doc["steps"] == 80 and doc["recorded_only"] and doc["final_loss"] == pytest.approx(4.2)
    assert no_steps_hint([], False, doc) is None


def test_a_stopped_node_is_never_the_cause(tmp_path):
    nodes = fake_run(tmp_path, ["exit 0\n", "exit 0\n"])
    for rank, text in ((0, "SignalException: Process 7 got signal: 15\n"), (1, "")):
        (tmp_path / "runs/r1" / f"node-{rank}.log").write_text(text)
    rdzv = nodes[0].rdzv
    # n1 failed on its own; n0 was stopped by fatpipe after it.
    line = describe_failure(LaunchResult("r1", tmp_path / "runs/r1", {"n0": 1, "n1": 2}, stopped=["n0"]), rdzv, 0)
    assert line.startswith("n1 failed first: exit status 2"), line
    # Every node that ended badly was stopped (`fatpipe stop` elsewhere): no cause to name.
    assert describe_failure(LaunchResult("r1", tmp_path / "runs/r1", {"n0": 143, "n1": 143},
                                         stopped=["n0", "n1"]), rdzv, 0) is None


class StubUp:
    """What `DownAfter` reads of an `up`: its spec, phases, messages, and a down that is only counted."""

    def __init__(self, result=None, launched=None):
        from types import SimpleNamespace

        from fatpipe.cli.downafter import DownAfter

        self.spec, self.said, self.destroyed = SimpleNamespace(name="c"), [], 0
        self.result, self.launched, self.left_up = result, launched, ""
        self.phases = SimpleNamespace(skip=lambda name, why: self.said.append(f"{name} skipped: {why}"))
        self.up = DownAfter
        self.say = self.said.append

    def down_after(self, code: int) -> int:
        return self.up.down_after(self, code)

    def live_nodes(self) -> list[str]:
        return self.up.live_nodes(self)

    def down(self, code: int) -> int:
        self.destroyed += 1
        return code


def test_down_after_destroys_only_once_every_node_recorded_its_exit_or_the_user_asked(tmp_path):
    from fatpipe.cli.signals import HEARD
    from fatpipe.ops.run.detach import DETACHED, LET_GO

    HEARD.signum, HEARD.stop = None, False
    ended = LaunchResult("r1", tmp_path, {"n0": 0, "n1": 1})
    up = StubUp(ended)
    assert up.down_after(1) == 1 and up.destroyed == 1  # failed, but every node recorded its end
    gave_up = LaunchResult("r1", tmp_path, {"n0": 0}, unknown={"n1": "unreachable"})
    up = StubUp(gave_up)
    assert up.down_after(UNFOLLOWED) == UNFOLLOWED and up.destroyed == 0
    assert "c stays up, and bills" in up.left_up and "`fatpipe down c` destroys it" in up.left_up \
        and "`fatpipe logs c -f` reattaches" in up.left_up, up.left_up
    # A termination (SIGTERM, SIGHUP) let go of the run: it goes on, and so does the cluster.
    let_go = LaunchResult("r1", tmp_path, unknown={"n0": LET_GO, "n1": LET_GO})
    HEARD.signum = 15
    up = StubUp(let_go)
    assert up.down_after(DETACHED) == DETACHED and up.destroyed == 0 and "n0, n1" in up.left_up
    up = StubUp()
    up.down_after(143)  # before the launch: nothing runs yet, the usual clean-up
    assert up.destroyed == 1
    HEARD.signum, HEARD.stop = 2, True
    up = StubUp(gave_up)
    up.down_after(130)  # Ctrl-C typed at the terminal (or --on-signal stop): the user's decision
    assert up.destroyed == 1
    HEARD.signum, HEARD.stop = None, False
    # The launch broke off on this machine (no result): the nodes are asked; one out of reach
    # or still running keeps the cluster up, a run that never started does not.
    nodes = gated_run(tmp_path, ["sleep 30\n", "exit 0\n"])
    start(nodes)
    try:
        (tmp_path / "gate-0").touch()
        up = StubUp(launched=nodes)
        up.down_after(141)
        assert up.destroyed == 0
    finally:
        (tmp_path / "gate-0").unlink()
        nodes[0].transport.run(nodes[0].stop_command(), timeout=40)
    (tmp_path / "runs/r1/node-1.pid").unlink()
    (tmp_path / "runs/r1/node-1.exit").unlink()
    up = StubUp(launched=[nodes[1]])  # never started there
    up.down_after(1)
    assert up.destroyed == 1


def test_a_reader_gone_on_this_machine_ends_nothing(tmp_path):
    # Whoever read the output went away (a closed pipe): the follow goes on quietly to the end.
    nodes = fake_run(tmp_path, [STEPS.format(n=5, pause=0.05), "echo one; exit 0\n"])
    start(nodes)

    def gone(node: str, line: str) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    assert follow_nodes(nodes, gone, timeout_s=60) == {"n0": 0, "n1": 0}


def test_once_the_follow_returns_no_line_is_shown_even_one_already_read(tmp_path):
    # A slow reader holds many lines already read from the stream when the follow ends; none of
    # them, nor what the node writes later (a stop's traceback), reaches the sink afterwards.
    nodes = fake_run(tmp_path, ['for i in $(seq 1 400); do echo "line $i"; done; sleep 30'])
    start(nodes)
    shown_at: list[float] = []

    def slow_sink(_node: str, _line: str) -> None:
        shown_at.append(time.monotonic())
        time.sleep(0.1)

    try:
        with pytest.raises(TimeoutError):
            follow_nodes(nodes, slow_sink, timeout_s=1)
        returned = time.monotonic()
        time.sleep(2)
    finally:
        nodes[0].transport.run(nodes[0].stop_command(), timeout=40)
    assert shown_at and all(t < returned for t in shown_at)


def test_the_rest_read_with_the_end_is_shown_whole_lines_and_the_last_one_too():
    """The node's end and the rest of its log come in one call; the rest is the final read, so a
    last line without a newline is whole, and a rest that could not be read is not an end."""
    from fatpipe.ops.run.follow import LogView

    seen: list[tuple[str, str]] = []
    view = LogView(type("Node", (), {"name": "n0"})(), lambda node, line: seen.append((node, line)),
                   threading.Event())
    view.offset = 10
    assert view.show_rest("step 1\r\nstep 2\n\nlast") and view.offset == 10 + len("step 1\r\nstep 2\n\nlast")
    assert [line for _, line in seen] == ["step 1", "step 2", "", "last"]
    assert view.show_rest("") and not view.show_rest(None) and len(seen) == 4
