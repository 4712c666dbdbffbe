"""The run steps `launch` and `up` share, each with its progress on the terminal: stage the data,
train. A command resolves its cluster once (ops/reach/cluster.py) and its `Request`
(cli/options.py), and hands both to these; they read no click context and look no cluster up by
name. The other shared steps live by what they serve, so a command imports only its own:
cli/deploying.py (deploy), cli/ready.py (wait), cli/netstep.py (netcheck), cli/newrun.py (a new
run's rendezvous), cli/results.py (a run's files). A command calls these; it never imports another
command's module.
"""

from __future__ import annotations

from rich.markup import escape

from fatpipe.ops.data.stage import push_data
from fatpipe.ops.run.detach import detached_line, let_go
from fatpipe.ops.run.follow import unfollowed_line
from fatpipe.ops.run.launch import Follow
from fatpipe.ops.run.leader import leader
from fatpipe.ops.run.training import launch_training
from fatpipe.trainer.staging.tidy import describe_removed

from .options import Request
from .render import exit_table, fetch_lines, log_sink, note
from .results import show_declared_pulls
from .signals import HEARD


def warn(out):
    """How a step shows a warning: one line, never wrapped, its text not read as markup."""
    return lambda line: out.print(f"[yellow]warning[/]: {escape(line)}", soft_wrap=True)


def stage_data(cluster, request: Request, phases, out) -> None:
    """`up`'s data phase: stage the cluster's [data] on every node, skipping what is already there."""
    data = cluster.data
    if data is None:
        phases.skip("data", "no [data] declared")
        return
    result = phases.run("data", f"stage {data.path} on every node", lambda: push_data(
        cluster.logging(note(out)), remote_python=request.run_options.get("remote_python"),
        node_progress=fetch_lines(note(out))))
    moved = result.moved
    how = f"{moved} moved node to node" if result.fetched is None else f"{sum(result.fetched.values())} fetched"
    phases.get("data").note = f"{result.manifest['total_bytes']} bytes; {how}"
    for node, names in result.removed.items():
        note(out)(f"{node}: {describe_removed(result.manifest, names)}")


def train_on_cluster(cluster, nodes, run_dir, out, follow=None, verbose=False):
    """Launch the run of `nodes` (its rendezvous's, ops.rdzv.noderun.node_runs) on the deployed
    `cluster`, print the nodes' logs, then the exit table; returns the LaunchResult. `follow`: how
    (ops.run.launch.Follow: timeout, detach, ...); `verbose`: every node's every line
    (ops.run.nodelines says what the terminal leaves to the node logs otherwise)."""
    project, name, rdzv = cluster.project, cluster.name, nodes[0].rdzv
    follow = follow or Follow()
    sink = log_sink(out, [n.name for n in nodes], rdzv.live, verbose)
    try:
        result = launch_training(cluster.logging(note(out)), nodes, run_dir, warn(out), sink=sink, follow=follow)
    finally:
        sink.flush()
    if follow.detach:
        out.print(f"run {rdzv.run_id} started; follow it with: fatpipe logs {name} -f")
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
        line = (detached_line(HEARD.why, result.run_id, name) if let_go(result.unknown) else
                unfollowed_line(result.run_id, name, result.unknown, result.exit_code))
        out.print(line, soft_wrap=True, highlight=False, markup=False)
        return result
    if project.spec.run.pull:  # the leader is asked only when something is to come back
        show_declared_pulls(project, leader(nodes, run_dir), out)
    out.print(f"logs and results in {run_dir}", markup=False)
    return result

