"""`fatpipe logs [CLUSTER]`: print a run's per-node logs, or follow them until the run ends."""

from __future__ import annotations

import click

from .options import cluster_argument, console, pass_project
from .render import exit_table, log_sink
from .steps import node_gone, pull_results


@click.command()
@cluster_argument
@click.option("--run", "run_id", default=None, help="Which run (default: the latest).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing until every node's process has exited.")
@click.option("-n", "--node", "node_names", multiple=True, help="Only this node (repeatable).")
@pass_project
def logs(project, cluster: str | None, run_id, follow: bool, node_names):
    """Print every node's log, each line prefixed with the node's name.

    The run is the last one launched (else the newest with logs). With -f, reattach to a running
    run (Ctrl-C detaches; the run goes on). Once the cluster is down, the logs kept here.
    """
    from fatpipe.infra.errors import FatpipeError
    from fatpipe.ops.launch import follow_nodes
    from fatpipe.ops.noderun import run_nodes

    name = project.cluster(cluster).name
    run_id, run_dir, nodes = run_nodes(project, name, run_id)
    if node_names:
        unknown = set(node_names) - {n.name for n in nodes}
        if unknown:
            raise FatpipeError(f"run {run_id} has no node {', '.join(sorted(unknown))}")
        nodes = [n for n in nodes if n.name in node_names]
    out = console()
    sink = log_sink(out, [n.name for n in nodes])
    gone = {n.name for n in nodes if node_gone(n)}
    if follow and gone:
        out.print(f"[dim]{', '.join(sorted(gone))}: gone (cluster down); run {run_id} has ended: "
                  "its logs as kept here[/]")
        follow = False
    if not follow:
        for node in nodes:
            local = run_dir / f"node-{node.plan.rank}.log"
            if node.transport.shares_fs or node.name in gone or (local.exists() and node.status() != "running"):
                text = local.read_text(errors="replace") if local.exists() else ""
            else:
                result = node.transport.run(node.follow_command(follow=False), timeout=60)
                if not result.ok:
                    raise FatpipeError(f"{node.transport.describe()}: cannot read the log: {result.reason()}")
                text = result.stdout
            for line in text.splitlines():
                sink(node.name, line)
        return
    from fatpipe.ops.noderun import LaunchResult

    try:
        codes = follow_nodes(nodes, sink, fail_grace_s=None)
    except KeyboardInterrupt:
        out.print(f"detached; run {run_id} goes on (fatpipe stop {name} ends it)")
        pull_results(out, nodes, run_dir, run_id, name)  # what exists so far
        return
    pull_results(out, nodes, run_dir, run_id, name)
    result = LaunchResult(run_id, run_dir, codes)
    out.print(exit_table(result))
    from rich.markup import escape

    from fatpipe.ops.failure import describe_failure

    failure = describe_failure(result, nodes[0].rdzv, 0, project.root) if nodes else None
    if failure:
        out.print(f"[red]error[/]: {escape(failure)}", soft_wrap=True)  # the line launch prints
