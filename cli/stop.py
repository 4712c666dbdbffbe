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
    from fatpipe.ops.launch import stop_nodes
    from fatpipe.ops.noderun import run_nodes

    run_id, _, nodes = run_nodes(project, project.cluster(cluster).name, run_id)
    stop_nodes(nodes)
    out = console()
    for node in nodes:
        out.print(f"  {node.name:<20} {node.status()}")
    out.print(f"run {run_id} stopped")
