"""`fatpipe logs [CLUSTER]`: print a run's per-node logs, or follow them until the run ends."""

from __future__ import annotations

import sys

from rich.markup import escape

from fatpipe.infra.errors import FatpipeError
from fatpipe.ops.rdzv.noderun import UNFOLLOWED, run_nodes
from fatpipe.ops.rdzv.rendezvous import read_rendezvous
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.run.end import ended_result, node_exits, read_logs, stopped_by_fatpipe
from fatpipe.ops.run.failure import describe_failure
from fatpipe.ops.run.follow import NodesUnreachable, follow_nodes, unfollowed_line
from fatpipe.ops.run.headline import keep_headline
from fatpipe.ops.run.liveleave import leave_lines

from .options import console, pass_project
from .render import exit_table, log_sink
from .results import node_gone, pull_results


@pass_project
def logs(project, cluster: str | None, run_id, follow: bool, node_names, unreachable_s: float,
         verbose: bool):
    """The body of `fatpipe logs`; its options and help are declared in run_commands.py."""
    resolved = Cluster.resolve(project, cluster)
    name = resolved.name
    run_id, run_dir, every_node = run_nodes(resolved, run_id)
    nodes = every_node
    if node_names:
        unknown = set(node_names) - {n.name for n in nodes}
        if unknown:
            raise FatpipeError(f"run {run_id} has no node {', '.join(sorted(unknown))}")
        nodes = [n for n in nodes if n.name in node_names]
    out = console()
    # Followed, a live run's steps read as one line for the cluster; printed node by node, each
    # node's own (ops.run.nodelines).
    live = follow and read_rendezvous(run_dir).live
    sink = log_sink(out, [n.name for n in nodes], live, verbose)
    gone = {n.name for n in every_node if node_gone(n)}
    # A live run goes on without a node that is gone: followed on the others, unless all are.
    if follow and gone and not (every_node[0].rdzv.live and len(gone) < len(every_node)):
        out.print(f"[dim]{', '.join(sorted(gone))}: gone (cluster down); run {run_id} has ended: "
                  "its logs as kept here[/]")
        follow = False
    if not follow:
        # Each ssh node's state and log in one round trip, all nodes at once.
        read = read_logs([n for n in every_node if not n.transport.shares_fs and n.name not in gone])
        for node in nodes:
            for line in _log_text(node, run_dir, gone, read).splitlines():
                sink(node.name, line)
        sys.exit(_how_it_ended(out, project, name, run_dir, every_node, gone, read=read))
    left: dict[str, dict] = {}  # nodes out of reach that a live run went on without
    try:
        try:  # a live run's mode is its rendezvous record's
            followed = follow_nodes(nodes, sink, fail_grace_s=None, unreachable_s=unreachable_s,
                                    live=every_node[0].rdzv.live, left=left)
        finally:
            sink.flush()
    except NodesUnreachable as e:
        out.print(unfollowed_line(run_id, name, dict.fromkeys(e.nodes, "unreachable")), soft_wrap=True,
                  highlight=False, markup=False)
        sys.exit(UNFOLLOWED)
    except KeyboardInterrupt:
        out.print(f"detached; run {run_id} goes on (fatpipe stop {name} ends it)")
        pull_results(out, nodes, run_dir, run_id, name)  # what exists so far
        return
    for line in leave_lines(followed, left):
        out.print(line, soft_wrap=True, highlight=False, markup=False)
    # A node the run left is gone from it: not asked for its end, nor pulled from.
    sys.exit(_how_it_ended(out, project, name, run_dir, every_node, gone | set(left), followed))


def _log_text(node, run_dir, gone: set[str], read: dict) -> str:
    """The node's log: the copy here once it is final (or the node shares this machine's
    files, or is gone), else read from the node (`read`: its state and log, read already)."""
    local = run_dir / f"node-{node.plan.rank}.log"
    state, text = read.get(node.name, (None, None))
    if node.transport.shares_fs or node.name in gone or (local.exists() and (state or node.status()) != "running"):
        return local.read_text(errors="replace") if local.exists() else ""
    if state is not None:
        return text or ""
    result = node.transport.run(node.follow_command(follow=False), timeout=60)
    if not result.ok:
        raise FatpipeError(f"{node.transport.describe()}: cannot read the log: {result.reason()}")
    return result.stdout


def _how_it_ended(out, project, cluster: str, run_dir, nodes, gone: set[str],
                  followed: dict | None = None, read: dict | None = None) -> int:
    """For a run that is over: pull what its ssh nodes wrote, then print what a followed launch
    prints when it ends (the exit table after -f, the failure line) and return its exit status.
    0 while it still runs, and for a run fatpipe stopped (`status` shows it as stopped).
    `followed`: the exit codes `-f` saw, for when some other node cannot tell yet."""
    run_id = run_dir.name
    codes = node_exits(run_dir, nodes, gone, read) or followed
    if codes is None:
        return 0  # still running (or a node cannot tell): nothing to judge yet
    unpulled = [n for n in nodes if not n.transport.shares_fs and n.name not in gone
                and not (run_dir / f"node-{n.plan.rank}.exit").exists()]
    if followed is not None or unpulled:  # the error files and stop markers are on the nodes
        pull_results(out, [n for n in nodes if n.name not in gone], run_dir, run_id, cluster)
    if nodes[0].rdzv.live:  # over: the run's record from every node's
        keep_headline(run_dir)
    result = ended_result(run_id, run_dir, nodes, codes)
    if followed is not None:
        out.print(exit_table(result))
    if stopped_by_fatpipe(result):
        return 0  # stopped, not failed: no cause to name
    failure = describe_failure(result, nodes[0].rdzv, 0, project.root)
    if failure:
        out.print(f"[red]error[/]: {escape(failure)}", soft_wrap=True)  # the line launch prints
    return result.exit_code
