"""`fatpipe wait [CLUSTER]`: block until every node is reachable, booted and tuned as its tier declares."""

from __future__ import annotations

import click

from fatpipe.infra.defaults import WAIT_TIMEOUT_S
from fatpipe.infra.runs import load_outputs
from fatpipe.ops.reach.cluster import Cluster

from .options import cluster_argument, console, outputs_option, pass_project
from .ready import require_ready, wait_ready
from .render import readiness_table


@click.command()
@cluster_argument
@click.option("--wait-timeout", "timeout_s", type=click.FloatRange(1), default=WAIT_TIMEOUT_S, show_default=True,
              help="Seconds to wait for every node (as `up --wait-timeout`).")
@outputs_option
@pass_project
def wait(project, cluster: str | None, timeout_s: float, outputs_file):
    """Wait until every node answers, has finished booting, and reads back the tier's sysctls."""
    cluster = Cluster.resolve(project, cluster)
    name = cluster.name
    outputs = load_outputs(project, name, outputs_file)
    out = console()
    states = wait_ready(cluster.deployed(outputs), timeout_s, out)
    out.print(readiness_table(states, f"{name}: {sum(s.ready for s in states)}/{len(states)} ready"))
    require_ready(states, timeout_s)
