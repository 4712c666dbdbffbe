"""`fatpipe stop [CLUSTER]`: stop a run on every node (what Ctrl-C in `fatpipe launch` does)."""

from __future__ import annotations

from fatpipe.infra.runinfo import run_info
from fatpipe.infra.runs import outputs_file
from fatpipe.ops.rdzv.noderun import run_nodes
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.run.headline import keep_headline
from fatpipe.ops.run.launch import stop_nodes
from fatpipe.ops.run.leader import leader

from .options import console, pass_project
from .results import node_gone, pull_results, show_declared_pulls


@pass_project
def stop(project, cluster: str | None, run_id):
    """The body of `fatpipe stop`; its options and help are declared in run_commands.py."""
    resolved = Cluster.resolve(project, cluster)
    name = resolved.name
    out = console()
    run_id, run_dir, nodes = run_nodes(resolved, run_id)
    live = [n for n in nodes if not node_gone(n)]
    if live:
        states = stop_nodes(live)  # with each node's state after, in the same round trip
    else:
        states = {}
    if all(s.startswith("unreachable") for s in states.values()) and not outputs_file(project, name).exists():
        out.print(f"{name} is not deployed (destroyed?): nothing runs there; run {run_id}: "
                  f"{run_info(run_dir, size=False).outcome}", highlight=False)
        return
    for node in nodes:
        out.print(f"  {node.name:<20} {states.get(node.name, 'gone')}")
    out.print(f"run {run_id} stopped")
    pull_results(out, live, run_dir, run_id, name)
    if nodes and nodes[0].rdzv.live:  # stopped: the run's record from every node's
        keep_headline(run_dir)
    head = leader(nodes, run_dir) if nodes else None
    if head in live:
        show_declared_pulls(project, head, out)  # [run] pull, from the node that ran rank 0
