"""`fatpipe rendezvous [CLUSTER] [-- SCRIPT ARGS]`: write a run's rendezvous files from the outputs."""

from __future__ import annotations

from fatpipe.infra.runs import load_outputs, mark_latest
from fatpipe.ops.rdzv.nodefiles import planned_group_ranks
from fatpipe.ops.reach.cluster import Cluster

from .newrun import open_run
from .options import console, pass_project, pass_request


@pass_project
@pass_request
def rendezvous(project, request, cluster: str | None, outputs_file):
    """The body of `fatpipe rendezvous`; its options and help are declared in train_commands.py."""
    cluster = Cluster.resolve(project, cluster)
    outputs = load_outputs(project, cluster.name, outputs_file)
    rdzv, run_dir = open_run(cluster.deployed(outputs), request)
    mark_latest(project, outputs.name, rdzv.run_id)
    print_rendezvous(rdzv, run_dir)


def print_rendezvous(rdzv, run_dir) -> None:
    out = console()
    out.print(f"run [bold]{rdzv.run_id}[/]: {rdzv.nnodes} node(s) x {rdzv.nproc_per_node} process(es), "
              f"c10d at {rdzv.rdzv_endpoint}, max restarts {rdzv.max_restarts}")
    ranks = planned_group_ranks([n.private_ip for n in rdzv.nodes])  # torch's order, not the nodes'
    for node in rdzv.nodes:
        where = node.netns or node.public_ip or node.transport
        out.print(f"  node {node.rank:<3} group rank {ranks[node.rank]:<3} {node.name:<20} {node.private_ip:<15} "
                  f"{node.transport:<6} {where}")
    out.print(f"files in {run_dir}; on a node, from the project folder: "
              f"bash {rdzv.run_rel}/node-<node>.sh", markup=False)
