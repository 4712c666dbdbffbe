"""Start a rendezvous'd run on every node, stream the per-node logs, stop it, collect exit codes.

Ctrl-C signals every node's process group. `run_on_all_nodes` is the one call other parts use
(netcheck runs its sweep through it).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from fatpipe.infra.errors import FatpipeError

from .failure import describe_failure
from .nodeenv import check_node_envs
from .nodefiles import write_rendezvous
from .noderun import (
    STOP_WAIT_S,
    LaunchResult,
    Log,
    NodeRun,
    Sink,
    node_runs,
    node_states,
    run_nodes,
)
from .prepare import prepare_envs, prepare_node
from .rendezvous import DEFAULT_RUN, Rendezvous, RunOptions, plan_rendezvous
from .runsync import pull_runs
from .transport import fan_out

# Once a node's torchrun has failed, the run cannot finish (the node count is fixed): its peers
# get this long to print their own errors, then they are stopped.
FAIL_GRACE_S = 10



def start_nodes(nodes: list[NodeRun]) -> None:
    results = fan_out(lambda n: n.transport.run(n.start_command(), timeout=60), nodes)
    failed = [f"{n.transport.describe()}: {r.reason()}" for n, r in zip(nodes, results, strict=True) if not r.ok]
    if failed:
        stop_nodes(nodes)
        raise FatpipeError("could not start the run on every node:\n  " + "\n  ".join(failed))


def stop_nodes(nodes: list[NodeRun]) -> None:
    """Signal every node's process group, wait for torchrun to wind down, kill what is left."""
    fan_out(lambda n: n.transport.run(n.stop_command(), timeout=STOP_WAIT_S + 30), nodes)


def follow_nodes(nodes: list[NodeRun], sink: Sink | None, follow: bool = True,
                 timeout_s: float | None = None, fail_grace_s: float | None = FAIL_GRACE_S,
                 stopped: list[str] | None = None) -> dict:
    """Stream every node's log to `sink` until all nodes exit; return {node: exit code}.

    When one node fails, the others get `fail_grace_s` to finish before they are stopped (their
    workers would otherwise wait in a collective, or torchrun in its exit barrier, for minutes);
    their names are appended to `stopped`. Raises TimeoutError past `timeout_s`; the caller
    stops the nodes.
    """
    codes: dict[str, int | None] = {}
    lock = threading.Lock()

    def watch(node: NodeRun) -> None:
        proc = node.transport.popen(node.follow_command(follow))
        try:
            for line in proc.stdout:
                if sink:
                    sink(node.name, line.rstrip("\n"))
        finally:
            proc.wait()
        code = node.exit_code() if follow else None
        with lock:
            codes[node.name] = code

    threads = [threading.Thread(target=watch, args=(n,), daemon=True, name=f"follow-{n.name}") for n in nodes]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s if timeout_s else None
    failed_at = None
    stopping = False
    while any(thread.is_alive() for thread in threads):
        time.sleep(0.2)
        now = time.monotonic()
        if deadline and now > deadline:
            raise TimeoutError(f"the run did not finish within {timeout_s:g} s")
        with lock:
            bad = any(c != 0 for c in codes.values())
        if bad and failed_at is None:
            failed_at = now
        if follow and failed_at and fail_grace_s is not None and not stopping and now - failed_at > fail_grace_s:
            stopping = True
            left = [n for n in nodes if n.name not in codes]
            if stopped is not None:
                stopped.extend(n.name for n in left)
            threading.Thread(target=stop_nodes, args=(left,), daemon=True).start()
    return {n.name: codes.get(n.name) for n in nodes}


def launch(project, rdzv: Rendezvous, run_dir: Path, *, sink: Sink | None = None,
           log: Log = lambda _: None, timeout_s: float | None = None, detach: bool = False,
           fail_grace_s: float | None = FAIL_GRACE_S) -> LaunchResult:
    """Prepare every node, start the run, stream its logs, and return how it ended.

    Ctrl-C (KeyboardInterrupt) or the timeout stops the run on every node before returning.
    """
    state_dir = project.state_dir(rdzv.cluster)
    nodes = node_runs(rdzv, state_dir)
    result = LaunchResult(rdzv.run_id, Path(run_dir))
    started, since = time.monotonic(), time.time()
    try:
        fan_out(lambda n: prepare_node(project, n, run_dir, rdzv.gpus_per_node, log), nodes)
        prepare_envs(project, nodes, rdzv.gpus_per_node, log)  # after the project: its requirements file
        log(check_node_envs(nodes, run_dir))  # unequal nodes are refused before anything starts
        try:
            start_nodes(nodes)
        except KeyboardInterrupt:  # some nodes may have started already
            stop_nodes(nodes)
            raise
        log(f"started run {rdzv.run_id} on {len(nodes)} node(s)")
        if detach:
            return result
        try:
            result.exit_codes = follow_nodes(nodes, sink, timeout_s=timeout_s, fail_grace_s=fail_grace_s,
                                             stopped=result.stopped)
        except TimeoutError as e:
            log(f"{e}: stopping every node")
            result.timed_out = True
            stop_nodes(nodes)
            result.exit_codes = {n.name: n.exit_code() for n in nodes}
        except KeyboardInterrupt:
            log("interrupted: stopping every node")
            result.interrupted = True
            stop_nodes(nodes)
            result.exit_codes = {n.name: n.exit_code() for n in nodes}
        for failure in pull_runs(nodes, Path(run_dir)).failed:
            log(failure)
        result.failure = describe_failure(result, rdzv, since, project.root)
    finally:
        result.elapsed_s = time.monotonic() - started
    return result


def running_nodes(project, cluster: str) -> tuple[str, list[str]] | None:
    """(run id, nodes still running it) for the cluster's latest run, or None when nothing runs.

    A second run would collide with it on the rendezvous port and the CPUs.
    """
    try:
        run_id, _, nodes = run_nodes(project, cluster)
    except FatpipeError:
        return None
    states = node_states(nodes)
    busy = [n.name for n, state in zip(nodes, states, strict=True) if state == "running"]
    return (run_id, busy) if busy else None


def refuse_if_running(project, cluster: str) -> None:
    busy = running_nodes(project, cluster)
    if busy:
        run_id, names = busy
        raise FatpipeError(f"run {run_id} is still running on {', '.join(names)}: follow it with "
                           f"`fatpipe logs {cluster} -f` or end it with `fatpipe stop {cluster}`")


def run_on_all_nodes(project, outputs, entry: list[str], *, run_dir: Path | None = None,
                     options: RunOptions = DEFAULT_RUN, timeout_s: float | None = 600,
                     sink: Sink | None = None, log: Log = lambda _: None) -> LaunchResult:
    """Run a torchrun entry on every node of `outputs` and wait for it: the call netcheck uses.

    `entry` is what follows torchrun's options, e.g. `["-m", "fatpipe.trainer.net.netbench", ...]`
    or `["train.py", "--lr", "1e-3"]`. Without `run_dir` a new run is made under
    `.fatpipe/<cluster>/runs/`; a given `run_dir` (inside the project folder) gets the
    rendezvous files, logs and exit files, and its last two path parts name the run.
    """
    from fatpipe.infra.runs import new_run

    if run_dir is None:
        run_id, run_dir = new_run(project, outputs.name)
    else:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        run_id = "-".join(run_dir.resolve().parts[-2:])
    rdzv = plan_rendezvous(project, outputs, run_id, run_dir, entry=entry, options=options)
    write_rendezvous(rdzv, run_dir)
    return launch(project, rdzv, run_dir, sink=sink, log=log, timeout_s=timeout_s)
