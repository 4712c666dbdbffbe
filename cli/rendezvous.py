"""`fatpipe rendezvous [CLUSTER] [-- SCRIPT ARGS]`: write a run's rendezvous files from the outputs."""

from __future__ import annotations

import click

from .options import cluster_argument, console, pass_project
from .runflags import ScriptCommand, new_rendezvous, run_options, train_overrides


@click.command(cls=ScriptCommand)
@cluster_argument
@train_overrides
@run_options
@pass_project
def rendezvous(project, cluster: str | None, outputs_file, nproc_per_node, max_restarts,
               join_timeout, remote_python):
    """Write rendezvous.json, node-<rank>.env and node-<rank>.sh for a new run.

    Everything after `--` is your torchrun script and its arguments; without it, the
    built-in trainer runs with the [train] settings (and the overrides given here).
    """
    from fatpipe.infra.runs import load_outputs

    outputs = load_outputs(project, project.cluster(cluster).name, outputs_file)
    rdzv, run_dir = new_rendezvous(project, outputs, nproc_per_node=nproc_per_node, max_restarts=max_restarts,
                                   join_timeout_s=join_timeout, remote_python=remote_python)
    print_rendezvous(rdzv, run_dir)


def print_rendezvous(rdzv, run_dir) -> None:
    out = console()
    out.print(f"run [bold]{rdzv.run_id}[/]: {rdzv.nnodes} node(s) x {rdzv.nproc_per_node} process(es), "
              f"c10d at {rdzv.rdzv_endpoint}, max restarts {rdzv.max_restarts}")
    for node in rdzv.nodes:
        where = node.netns or node.public_ip or node.transport
        out.print(f"  rank {node.rank:<3} {node.name:<20} {node.private_ip:<15} {node.transport:<6} {where}")
    out.print(f"files in {run_dir}; on a node, from the project folder: "
              f"bash {rdzv.run_rel}/node-<rank>.sh", markup=False)
