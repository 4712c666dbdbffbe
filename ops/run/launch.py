"""Start a rendezvous'd run on every node, stream the per-node logs, stop it, collect exit codes.

Ctrl-C signals every node's process group. `launch` is the one call other parts use (netcheck
runs its sweep through it, after the same one call per node: ops/run/checks.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fatpipe.infra.defaults import UNREACHABLE_TIMEOUT_S
from fatpipe.infra.errors import FatpipeError

from ..env.nodeenv import ENV_FILE, check_node_envs
from ..rdzv.faultmode import FaultMode, without_torchft
from ..rdzv.noderun import (
    LaunchResult,
    Log,
    NodeRun,
    Sink,
    node_runs,
)
from ..rdzv.rendezvous import Rendezvous, restart_instead
from ..reach.cluster import Cluster
from ..reach.transport import fan_out
from .checks import ask_launch_checks
from .detach import LET_GO, Detach
from .failure import describe_failure
from .follow import (
    FAIL_GRACE_S,
    NodesUnreachable,
    follow_nodes,
    read_end,
    stop_nodes,
)
from .headline import keep_headline
from .liveleave import leave_lines
from .prepare import prepare_envs, prepare_node
from .sync import pull_runs, push_run


def start_nodes(nodes: list[NodeRun]) -> None:
    results = fan_out(lambda n: n.transport.run(n.start_command(), timeout=60), nodes)
    failed = [f"{n.transport.describe()}: {r.reason()}" for n, r in zip(nodes, results, strict=True) if not r.ok]
    if failed:
        stop_nodes(nodes)
        raise FatpipeError("could not start the run on every node:\n  " + "\n  ".join(failed))


@dataclass(frozen=True)
class Follow:
    """How `launch` follows the run it started."""

    timeout_s: float | None = None  # past this every node is stopped (exit 124)
    unreachable_s: float | None = None  # a node out of reach this long ends the follow
    detach: bool = False  # return once every node has started
    # Called once every node has started, before the follow: a live run's caller lets the
    # cluster's lock go there (a deploy that makes a lost node again, a rejoin, may run).
    on_started: Callable[[], None] | None = None
    # A Detach (a termination of this command, cli/signals.py) during the follow lets go of the
    # run, which goes on on its nodes (LET_GO), instead of stopping it: a training run's, not a netcheck's.
    signal_detaches: bool = False


def launch(cluster: Cluster, nodes: list[NodeRun], run_dir: Path, *, sink: Sink | None = None,
           follow: Follow = Follow()) -> LaunchResult:
    """Prepare every node, start the run, stream its logs, and return how it ended.

    `nodes`: the run's, made once by the caller (ops.rdzv.noderun.node_runs: its rendezvous
    reached through the cluster's transports), which every stage below takes.

    Ctrl-C (KeyboardInterrupt) or the timeout stops the run on every node before returning; a
    termination (Detach) with `follow.signal_detaches` lets go of it instead: every node reads
    LET_GO in `unknown`, nothing is stopped (ops/run/detach.py). A
    node out of reach for longer than `follow.unreachable_s` (default UNREACHABLE_TIMEOUT_S)
    ends the follow, not the run: the result names it in `unknown` and nothing is stopped.
    """
    timeout_s, unreachable_s = follow.timeout_s, follow.unreachable_s or UNREACHABLE_TIMEOUT_S
    project, log, rdzv = cluster.project, cluster.log, nodes[0].rdzv
    result = LaunchResult(rdzv.run_id, Path(run_dir), live=rdzv.live)
    started, since = time.monotonic(), time.time()
    try:
        # Its callers checked the firewall and the running run; the rest of the checks: one call
        # per node, unless the command asked it already (ops/run/checks.py).
        ask_launch_checks(cluster, nodes, firewall=False)
        fan_out(lambda n: prepare_node(cluster, n, run_dir, rdzv.gpus_per_node), nodes)
        prepare_envs(cluster, nodes, rdzv.gpus_per_node)  # after the project: its requirements file
        # Unequal nodes are refused before anything starts; an `auto` live run may turn restart.
        rdzv, nodes = checked_envs(rdzv, nodes, Path(run_dir), cluster)
        result.live = rdzv.live
        try:
            start_nodes(nodes)
        except KeyboardInterrupt:  # some nodes may have started already
            stop_nodes(nodes)
            raise
        if follow.detach:
            log(f"started run {rdzv.run_id} on {len(nodes)} node(s)")
            return result
        try:  # from here a Ctrl-C or SIGTERM stops every node
            log(f"started run {rdzv.run_id} on {len(nodes)} node(s)")
            if follow.on_started and rdzv.live:
                follow.on_started()
            result.exit_codes = follow_nodes(nodes, sink, timeout_s=timeout_s, fail_grace_s=FAIL_GRACE_S,
                                             stopped=result.stopped, unreachable_s=unreachable_s,
                                             live=rdzv.live, left=result.left)
            for line in live_leavers(result):
                log(line)
        except NodesUnreachable as e:
            log(f"{e}: stopped following; the run goes on on its nodes")
            result.exit_codes = e.codes
            result.unknown = {n.name: "unreachable" if n.name in e.nodes else "running"
                              for n in nodes if n.name not in e.codes}
        except TimeoutError as e:
            log(f"{e}: stopping every node")
            result.timed_out = True
            stop_nodes(nodes)
            read_ends(nodes, result)
        except KeyboardInterrupt as e:
            if isinstance(e, Detach) and follow.signal_detaches:  # the run goes on; the caller says so
                result.unknown = dict.fromkeys((n.name for n in nodes), LET_GO)
            else:
                log("interrupted: stopping every node")
                result.interrupted = True
                stop_nodes(nodes)
                read_ends(nodes, result)
        # What the nodes that ended wrote; one a live run left is out of reach: not waited for.
        ended = [n for n in nodes if n.name not in result.unknown and n.name not in result.left]
        for failure in pull_through(ended, Path(run_dir), unreachable_s, log):
            log(failure)
        if rdzv.live and not result.unknown:  # the run's record from every node's (`headline`)
            keep_headline(Path(run_dir))
        result.stopped += [n.name for n in ended if n.name not in result.stopped
                           and (Path(run_dir) / f"node-{n.plan.rank}.stop").exists()]
        result.failure = describe_failure(result, rdzv, since, project.root)
    finally:
        cluster.answers.forget_all()  # what the first call brought is this launch's alone
        result.elapsed_s = time.monotonic() - started
    return result


def checked_envs(rdzv: Rendezvous, nodes: list[NodeRun], run_dir: Path,
                 cluster: Cluster) -> tuple[Rendezvous, list[NodeRun]]:
    """The node environment check, then the fault tolerance in force, logged: a live run that
    `auto` chose turns restart where a node has no torchft (its files written and sent again)."""
    log = cluster.log
    log(check_node_envs(nodes, run_dir, rdzv.live and not rdzv.fault_auto))
    if rdzv.live and rdzv.fault_auto:
        reports = json.loads((run_dir / ENV_FILE).read_text())["nodes"]
        if missing := without_torchft(reports):
            rdzv = restart_instead(rdzv, run_dir, f"no torchft on {', '.join(missing)}")
            nodes = node_runs(rdzv, cluster)
            remote = [n for n in nodes if not n.transport.shares_fs]
            for node, sent in zip(remote, fan_out(lambda n: push_run(n, run_dir, True), remote), strict=True):
                if not sent.ok:
                    raise FatpipeError(f"{node.name}: copy the run's inputs failed: {sent.reason()}")
    if rdzv.fault_why:
        log(FaultMode(rdzv.fault_tolerance, rdzv.fault_why).line())
    return rdzv, nodes


def live_leavers(result: LaunchResult) -> list[str]:
    """Under live fault tolerance, one line per node the run finished without."""
    return leave_lines(result.exit_codes, result.left) if result.live else []


def read_ends(nodes: list[NodeRun], result: LaunchResult) -> None:
    """Each node's end after a stop, as the node records it; one out of reach is `unknown`."""
    for node, end in zip(nodes, fan_out(read_end, nodes), strict=True):
        if end.ended:
            result.exit_codes[node.name] = end.code
        else:
            result.unknown[node.name] = end.state


def pull_through(nodes: list[NodeRun], run_dir: Path, within_s: float, log: Log) -> list[str]:
    """`pull_ended`, finished though a termination asks to let go meanwhile: the run has ended
    on every node pulled from, and its results come back before the command goes on."""
    while True:
        try:
            return pull_ended(nodes, run_dir, within_s, log)
        except Detach as e:
            log(f"{e.why}: the run has ended; its results come back first")


def pull_ended(nodes: list[NodeRun], run_dir: Path, within_s: float, log: Log) -> list[str]:
    """Pull what ended nodes wrote; a node whose pull failed is tried again, with pauses, while
    it answers within `within_s` (a connection that dropped just then). The failures left."""
    pulled = pull_runs(nodes, run_dir)
    placed = set(pulled.placed)
    deadline, pause = time.monotonic() + within_s, 5.0
    while pulled.failed and time.monotonic() + pause < deadline:
        left = [n for n in nodes if not n.transport.shares_fs and n.name not in placed]
        log(f"pulling again from {', '.join(n.name for n in left)} in {pause:g} s")
        time.sleep(pause)
        pulled = pull_runs(left, run_dir)
        placed |= set(pulled.placed)
        pause = min(pause * 2, 60.0)
    return pulled.failed


def run_id_of(run_dir: Path) -> str:
    """The run id of a run folder given by a caller (netcheck's, inside `up`'s run): its last two path parts."""
    return "-".join(Path(run_dir).resolve().parts[-2:])
