"""`fatpipe down [CLUSTER]`: destroy the cluster's resources and remove its outputs."""

from __future__ import annotations

import click

from .options import cluster_argument, console, engine_option, pass_project, verbose_option
from .steps import terraform_log


@click.command()
@cluster_argument
@engine_option
@verbose_option
@pass_project
def down(project, cluster: str | None, engine: str, verbose: bool):
    """Destroy every node of the cluster (a sim cluster's namespaces and bridge too)."""
    from fatpipe.stacks.engine import destroy_cluster

    name = cluster or project.cluster(None).name
    swept = destroy_cluster(project, name, engine=engine, log=terraform_log(verbose))
    note = f" (also removed leftovers: {', '.join(swept)})" if swept else ""
    console().print(f"{name}: destroyed{note}")
