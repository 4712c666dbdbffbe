"""Start a rendezvous'd run on every node, stream the per-node logs, stop it, collect exit codes.

Ctrl-C signals every node's process group. `launch` is the one call other parts use (netcheck
runs its sweep through it, after the same one call per node: ops/run/runchecks.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fatpipe.infra.defaults import UNREACHABLE_TIMEOUT_S
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.runs import find_run

from ..env.nodeenv import ENV_FILE, check_node_envs
from ..rdzv.faultmode import FaultMode, without_torchft
from ..rdzv.noderun import (
    LaunchResult,
    Log,
    NodeRun,
    Sink,
    node_runs,
    node_states,
    ridden_out,
    run_nodes,
)
from ..rdzv.rendezvous import Rendezvous, read_rendezvous, restart_instead
from ..reach.nodecall import forget_all
from ..reach.transport import fan_out
from .failure import describe_failure
from .follow import (
    FAIL_GRACE_S,
    NodesUnreachable,
    follow_nodes,
    read_end,
    stop_nodes,
)
from .prepare import prepare_envs, prepare_node
from .runchecks import ask_launch_checks
from .runsync import pull_runs, push_run


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


def launch(project, rdzv: Rendezvous, run_dir: Path, *, sink: Sink | None = None,
           log: Log = lambda _: None, follow: Follow = Follow()) -> LaunchResult:
    """Prepare every node, start the run, stream its logs, and return how it ended.

    Ctrl-C (KeyboardInterrupt) or the timeout stops the run on every node before returning. A
    node out of reach for longer than `follow.unreachable_s` (default UNREACHABLE_TIMEOUT_S)
    ends the follow, not the run: the result names it in `unknown` and nothing is stopped.
    """
    timeout_s, unreachable_s = follow.timeout_s, follow.unreachable_s or UNREACHABLE_TIMEOUT_S
    state_dir = project.state_dir(rdzv.cluster)
    nodes = node_runs(rdzv, state_dir)
    result = LaunchResult(rdzv.run_id, Path(run_dir), live=rdzv.live)
    started, since = time.monotonic(), time.time()
    try:
        # Its callers checked the firewall and the running run; the rest of the checks: one call
        # per node, unless the command asked it already (ops/run/runchecks.py).
        ask_launch_checks(project, None, rdzv, firewall=False)
        fan_out(lambda n: prepare_node(project, n, run_dir, rdzv.gpus_per_node, log), nodes)
        prepare_envs(project, nodes, rdzv.gpus_per_node, log)  # after the project: its requirements file
        # Unequal nodes are refused before anything starts; an `auto` live run may turn restart.
        rdzv, nodes = checked_envs(rdzv, nodes, Path(run_dir), state_dir, log)
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
                                             live=rdzv.live)
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
        except KeyboardInterrupt:
            log("interrupted: stopping every node")
            result.interrupted = True
            stop_nodes(nodes)
            read_ends(nodes, result)
        ended = [n for n in nodes if n.name not in result.unknown]
        for failure in pull_ended(ended, Path(run_dir), unreachable_s, log):
            log(failure)
        result.stopped += [n.name for n in ended if n.name not in result.stopped
                           and (Path(run_dir) / f"node-{n.plan.rank}.stop").exists()]
        result.failure = describe_failure(result, rdzv, since, project.root)
    finally:
        forget_all()  # what the first call brought is this launch's alone
        result.elapsed_s = time.monotonic() - started
    return result


def checked_envs(rdzv: Rendezvous, nodes: list[NodeRun], run_dir: Path, state_dir: Path,
                 log: Log) -> tuple[Rendezvous, list[NodeRun]]:
    """The node environment check, then the fault tolerance in force, logged: a live run that
    `auto` chose turns restart where a node has no torchft (its files written and sent again)."""
    log(check_node_envs(nodes, run_dir, rdzv.live and not rdzv.fault_auto))
    if rdzv.live and rdzv.fault_auto:
        reports = json.loads((run_dir / ENV_FILE).read_text())["nodes"]
        if missing := without_torchft(reports):
            rdzv = restart_instead(rdzv, run_dir, f"no torchft on {', '.join(missing)}")
            nodes = node_runs(rdzv, state_dir)
            remote = [n for n in nodes if not n.transport.shares_fs]
            for node, sent in zip(remote, fan_out(lambda n: push_run(n, run_dir, True), remote), strict=True):
                if not sent.ok:
                    raise FatpipeError(f"{node.name}: copy the run's inputs failed: {sent.reason()}")
    if rdzv.fault_why:
        log(FaultMode(rdzv.fault_tolerance, rdzv.fault_why).line())
    return rdzv, nodes


def live_leavers(result: LaunchResult) -> list[str]:
    """Under live fault tolerance, one line per node the run finished without."""
    if not result.live or 0 not in result.exit_codes.values():
        return []
    return [f"{name} left the run ({'lost: its end is unknown' if code is None else f'status {code}'}); "
            "the other nodes finished it" for name, code in result.exit_codes.items()
            if ridden_out(code)]


def read_ends(nodes: list[NodeRun], result: LaunchResult) -> None:
    """Each node's end after a stop, as the node records it; one out of reach is `unknown`."""
    for node, end in zip(nodes, fan_out(read_end, nodes), strict=True):
        if end.ended:
            result.exit_codes[node.name] = end.code
        else:
            result.unknown[node.name] = end.state


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


def running_nodes(project, cluster: str, nodes: list[NodeRun] | None = None) -> tuple[str, list[str]] | None:
    """(run id, nodes still running it) for the cluster's latest run (its `nodes`, when read
    already), or None when nothing runs. A second run would collide with it on the rendezvous
    port and the CPUs.
    """
    if nodes is None:
        try:
            nodes = run_nodes(project, cluster)[2]
        except FatpipeError:
            return None
    if not nodes:
        return None
    run_id = nodes[0].rdzv.run_id
    states = node_states(nodes)
    busy = [n.name for n, state in zip(nodes, states, strict=True) if state == "running"]
    return (run_id, busy) if busy else None


def refuse_if_running(project, cluster: str, nodes: list[NodeRun] | None = None,
                      live_ok: bool = False) -> str | None:
    """Refuse while a run is going on the cluster; with `live_ok`, a live run is let go on (it
    rides out a node made again) and the line to show about it is returned."""
    busy = running_nodes(project, cluster, nodes)
    if busy:
        run_id, names = busy
        if live_ok and read_rendezvous(find_run(project, cluster, run_id)[1]).live:
            return (f"run {run_id} goes on live on {', '.join(names)}: a node made again here joins it "
                    f"with `fatpipe launch {cluster} --rejoin NODE`")
        raise FatpipeError(f"run {run_id} is still running on {', '.join(names)}: follow it with "
                           f"`fatpipe logs {cluster} -f` or end it with `fatpipe stop {cluster}`")
    return None


def run_id_of(run_dir: Path) -> str:
    """The run id of a run folder given by a caller (netcheck's, inside `up`'s run): its last two path parts."""
    return "-".join(Path(run_dir).resolve().parts[-2:])
