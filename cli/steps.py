"""The steps several commands share, each with its progress on the terminal: deploy, wait, rendezvous,
netcheck, train. A command calls these; it never imports another command's module.
"""

from __future__ import annotations

import click

from .options import console, given_run_options, overrides, resolve_train, script_args
from .render import exit_table, fetch_lines, log_sink, netcheck_tables, note
from .signals import HEARD


def node_gone(node) -> bool:
    """Whether a run's node no longer exists on this machine (a sim namespace removed by `down`):
    then its folder's files are all there is, and asking it would only time out."""
    from fatpipe.stacks.simlinks import netns_exists

    return node.plan.transport == "netns" and not netns_exists(node.plan.netns or "")


def pull_results(out, nodes, run_dir, run_id: str, cluster: str, checkpoints: bool = False):
    """Bring what the ssh nodes wrote for the run into its folder here; one line per node whose
    pull failed (its files stay on the node). Returns the ops.run.runsync.Pulled."""
    from rich.markup import escape

    from fatpipe.ops.run.runsync import pull_runs

    pulled = pull_runs(nodes, run_dir, checkpoints=checkpoints)
    for failure in pulled.failed:
        out.print(f"[yellow]warning[/]: {escape(failure)}", soft_wrap=True)
    if pulled.placed and not checkpoints:
        out.print(f"results of run {run_id} pulled from {len(pulled.placed)} node(s); checkpoints stay on "
                  f"the nodes (fatpipe runs pull {cluster} {run_id} --checkpoints)", highlight=False)
    return pulled


def show_declared_pulls(project, node, out) -> None:
    """`[run] pull`: what the run's script wrote on the node of rank 0 (a NodeRun, ops.run.leader),
    one line per path."""
    from rich.markup import escape

    from fatpipe.ops.run.pullpaths import pull_declared as bring
    from fatpipe.ops.run.pullpaths import source_of_run

    for pulled, line in bring(project, source_of_run(node)):
        out.print(("" if pulled else "[yellow]warning[/]: ") + escape(line), highlight=False, soft_wrap=True)


def terraform_log(verbose: bool):
    """Echo engine output to stderr: every line with -v, else only what names a resource, and
    fatpipe's own lines about the deployment."""
    err = console(stderr=True)

    def log(line: str) -> None:
        if verbose or ": Creation complete" in line or ": Destruction complete" in line \
                or "Apply complete" in line or "Destroy complete" in line or line.startswith("fatpipe: "):
            err.print(line, style="dim", markup=False, soft_wrap=True)

    return log


def deploy_outputs(project, name: str | None, engine: str, yes: bool, verbose: bool, replace: bool = False):
    """Apply the cluster's stack, asking on the terminal before paid resources and before existing
    nodes are replaced, destroyed or stopped (unless `replace`); its outputs. The host keys of the
    nodes it recreated are forgotten (`ops.reach.hostkeys`)."""
    from fatpipe.ops.reach.hostkeys import deploy_forgetting_recreated
    from fatpipe.stacks.engine import deploy_cluster

    from .options import approve_node_changes

    return deploy_forgetting_recreated(project, project.cluster(name).name, lambda: deploy_cluster(
        project, name, engine=engine, yes=yes, confirm=lambda question: click.confirm(question, default=False, err=True),
        log=terraform_log(verbose), approve=lambda changes: approve_node_changes(project, name, changes, replace)))


def wait_ready(project, outputs, timeout_s: float, out):
    """Wait with a live summary line; returns the final per-node states.

    Sim nodes that are gone from this machine (a restart clears namespaces) are named at once,
    with the fix, instead of being waited for.
    """
    from fatpipe.infra.errors import FatpipeError
    from fatpipe.ops.reach.hostkeys import pin_cluster_keys
    from fatpipe.ops.reach.wait import wait_for_nodes
    from fatpipe.stacks.providers import provider_for
    from fatpipe.stacks.providers.sim import vanished_nodes

    gone = vanished_nodes(outputs)
    if gone:
        raise FatpipeError(f"{', '.join(gone)}: gone from this machine, though {outputs.name} is deployed "
                           f"(a restart clears network namespaces): `fatpipe deploy {outputs.name}` "
                           "makes them again")

    with out.status(f"waiting for {len(outputs.nodes)} node(s)") as status:
        pin_cluster_keys(project, outputs, provider_for(outputs.provider).console_output, timeout_s)
        def update(states):
            ready = sum(s.ready for s in states)
            pending = next((f"{s.name}: {s.reason}" for s in states if not s.ready), "")
            status.update(f"{ready}/{len(states)} node(s) ready {pending}")

        return wait_for_nodes(project, outputs, timeout_s=timeout_s, on_update=update)


def require_ready(states, timeout_s: float) -> None:
    """Raise naming every node that is not ready, with its reason."""
    from fatpipe.infra.errors import FatpipeError

    late = [s for s in states if not s.ready]
    if late:
        reasons = "\n  ".join(f"{s.name}: {s.reason}" for s in late)
        raise FatpipeError(f"{len(late)} node(s) not ready after {timeout_s:g} s:\n  {reasons}")


def open_run(project, outputs, train=None, script=None, run=None):
    """A new run (or the given (id, folder)) with its rendezvous written; returns (rdzv, run_dir).

    `train`, `script` and the run options default to this command's [train] overrides,
    `-- SCRIPT ARGS` and torchrun flags.
    """
    from fatpipe.infra.runs import new_run
    from fatpipe.ops.rdzv.rendezvous import new_rendezvous

    train = train if train is not None else resolve_train(project, overrides())
    script = script if script is not None else script_args()
    run_id, run_dir = run or new_run(project, outputs.name)
    try:
        rdzv = new_rendezvous(project, outputs, run_id, run_dir, train=train, script=script,
                               options=given_run_options())
    except BaseException:
        if run is None and not any(run_dir.iterdir()):  # refused before writing anything: no clutter
            run_dir.rmdir()
        raise
    return rdzv, run_dir


def check_firewall(project, outputs, out) -> None:
    """Before the rendezvous port opens: refuse a node without its host firewall, naming it;
    warn, at every launch, about a cluster that opted out (docs/ARCHITECTURE.md)."""
    from rich.markup import escape

    from fatpipe.ops.reach.firewall_check import require_firewall as check

    for warning in check(project, outputs):
        out.print(f"[yellow]warning[/]: {escape(warning)}", soft_wrap=True)


def netcheck_step(project, outputs, options, out, run_dir=None, sink=None, remote_python=None):
    """Run the link check, print its tables (also when the gate fails) and where it wrote them."""
    from fatpipe.ops.net.netcheck import NetcheckFailed
    from fatpipe.ops.net.netcheck import run_netcheck as measure

    try:  # its first call to each node reads the firewall too (ops.net.netcheck.launch_netbench)
        doc = measure(project, outputs, run_dir=run_dir, options=options, log=note(out), sink=sink,
                      remote_python=remote_python)
    except NetcheckFailed as e:
        netcheck_tables(e.doc, out)
        raise
    netcheck_tables(doc, out)
    return doc


def stage_data(project, outputs, phases, out) -> None:
    """`up`'s data phase: stage the cluster's [data] on every node, skipping what is already there."""
    from fatpipe.infra.dataspec import cluster_data
    from fatpipe.ops.data.stage import push_data
    from fatpipe.trainer.staging.tidy import describe_removed

    data = cluster_data(project.spec, outputs.name)
    if data is None:
        phases.skip("data", "no [data] declared")
        return
    result = phases.run("data", f"stage {data.path} on every node", lambda: push_data(
        project, outputs, remote_python=given_run_options().remote_python, log=note(out),
        node_progress=fetch_lines(note(out))))
    moved = sum(n["received"] for n in (result.fanout or {}).get("nodes", []))
    how = f"{moved} moved node to node" if result.fetched is None else f"{sum(result.fetched.values())} fetched"
    phases.get("data").note = f"{result.manifest['total_bytes']} bytes; {how}"
    for node, names in result.removed.items():
        note(out)(f"{node}: {describe_removed(result.manifest, names)}")


def _checker_python(rdzv) -> str | None:
    """The interpreter that hashes a node's data: the run's own when one was given, else python3."""
    from fatpipe.infra.node import REMOTE_VENV

    python = rdzv.nodes[0].python if rdzv.nodes else None
    return None if python in (None, f"{REMOTE_VENV}/bin/python") else python


def train_on_cluster(project, outputs, rdzv, run_dir, out, follow=None, verbose=False):
    """Launch `rdzv`, print the nodes' logs, then the exit table; returns the LaunchResult.
    `follow`: how (ops.run.launch.Follow: timeout, detach, ...); `verbose`: every node's every
    line (ops.run.nodelines says what the terminal leaves to the node logs otherwise)."""
    from rich.markup import escape

    from fatpipe.infra.runs import latest_run_id, mark_latest
    from fatpipe.ops.data.datacheck import require_data
    from fatpipe.ops.rdzv.noderun import node_runs
    from fatpipe.ops.run.detach import detached_line, let_go
    from fatpipe.ops.run.follow import unfollowed_line
    from fatpipe.ops.run.launch import Follow
    from fatpipe.ops.run.launch import launch as launch_run
    from fatpipe.ops.run.leader import leader

    follow = follow or Follow()
    check_firewall(project, outputs, out)
    names = [n.name for n in rdzv.nodes]
    require_data(project, outputs, _checker_python(rdzv))  # a node whose data differs: refused, named
    # The launched run becomes the latest (what status, logs and stop mean); one that never
    # started (nodes could not be prepared, a start refused) gives the mark back.
    before = latest_run_id(project, outputs.name)
    mark_latest(project, outputs.name, rdzv.run_id)
    sink = log_sink(out, names, rdzv.live, verbose)
    try:
        result = launch_run(project, rdzv, run_dir, sink=sink, log=note(out), follow=follow)
    except BaseException:
        mark_latest(project, outputs.name, before)
        raise
    finally:
        sink.flush()
    if follow.detach:
        out.print(f"run {rdzv.run_id} started; follow it with: fatpipe logs {outputs.name} -f")
        return result
    codes = list(result.exit_codes.values())
    if codes and all(code == 0 for code in codes):  # the table only where a node says otherwise
        out.print(f"exit status: all {len(codes)} node(s) 0")
    else:
        out.print(exit_table(result))
    if result.failure:
        out.print(f"[red]error[/]: {escape(result.failure)}", soft_wrap=True)  # one line, unwrapped
    if result.interrupted:
        out.print("[yellow]interrupted[/]: the run was stopped on every node")
    elif result.timed_out:
        out.print(f"[red]timed out[/] after {follow.timeout_s:g} s: the run was stopped on every node")
    elif result.unknown and not result.failure:  # its results are still being made on the nodes
        line = (detached_line(HEARD.why, result.run_id, outputs.name) if let_go(result.unknown) else
                unfollowed_line(result.run_id, outputs.name, result.unknown, result.exit_code))
        out.print(line, soft_wrap=True, highlight=False, markup=False)
        return result
    if project.spec.run.pull:  # the leader's transport is made only when something is to come back
        show_declared_pulls(project, leader(node_runs(rdzv, project.state_dir(outputs.name)), run_dir), out)
    out.print(f"logs and results in {run_dir}", markup=False)
    return result

