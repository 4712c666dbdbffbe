"""`fatpipe down [CLUSTER]`: destroy the cluster's resources and remove its outputs."""

from __future__ import annotations

import sys

from fatpipe.stacks.app import OUTDIR
from fatpipe.stacks.engine import destroy_cluster

from .deploying import terraform_log
from .options import console, pass_project
from .signals import TeardownAbandoned, changing, guarded_teardown


@pass_project
def down(project, cluster: str | None, engine: str, verbose: bool):
    """The body of `fatpipe down`; its options and help are declared in cluster_commands.py."""
    name = _known(project, cluster)
    spec = project.cluster(name) if name in project.clusters else None  # None: no longer declared
    out = console()
    with changing(project, name, "down"):
        try:
            with guarded_teardown(out, f"the teardown of {name}"):
                result = destroy_cluster(project, spec, name, engine=engine, log=terraform_log(verbose))
        except TeardownAbandoned:
            out.print(f"[red]teardown of {name} abandoned[/]: resources may be left; run `fatpipe down {name}` again")
            sys.exit(130)
    out.print(f"{name}: {result.summary()}", highlight=False)


def _known(project, cluster: str | None) -> str:
    """The cluster to destroy: a declared one, or one this folder still holds state of (a cluster
    since removed from the file); a typo is refused, exit 2, with the declared names."""
    if cluster is None or cluster in project.clusters:
        return project.cluster(cluster).name
    leftovers = [project.state_dir(cluster) / "terraform.tfstate", project.state_dir(cluster) / "outputs.json",
                 project.root / OUTDIR / "stacks" / cluster / "cdk.tf.json"]
    if any(path.is_file() for path in leftovers):
        return cluster
    return project.cluster(cluster).name  # raises: no cluster 'x'; declared: ...
