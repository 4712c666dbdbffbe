"""`fatpipe stop [CLUSTER]`: stop a run on every node (what Ctrl-C in `fatpipe launch` does)."""

from __future__ import annotations

import click

from .options import cluster_argument, console, pass_project


@click.command()
@cluster_argument
@click.option("--run", "run_id", default=None, help="Which run (default: the latest).")
@pass_project
def stop(project, cluster: str | None, run_id):
    """Signal the run's torchrun on every node, wait for it to wind down, kill what is left."""
    from fatpipe.infra.launch import node_runs, stop_nodes
    from fatpipe.infra.rendezvous import read_rendezvous
    from fatpipe.infra.runs import find_run

    name = project.cluster(cluster).name
    run_id, run_dir = find_run(project, name, run_id)
    nodes = node_runs(read_rendezvous(run_dir), project.state_dir(name))
    stop_nodes(nodes)
    out = console()
    for node in nodes:
        out.print(f"  {node.name:<20} {node.status()}")
    out.print(f"run {run_id} stopped")
