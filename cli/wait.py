"""`fatpipe wait [CLUSTER]`: block until every node is reachable, booted and tuned as its tier declares."""

from __future__ import annotations

from fatpipe.infra.runs import load_outputs
from fatpipe.ops.reach.cluster import Cluster

from .options import console, pass_project
from .ready import require_ready, wait_ready
from .render import readiness_table


@pass_project
def wait(project, cluster: str | None, timeout_s: float, outputs_file):
    """The body of `fatpipe wait`; its options and help are declared in cluster_commands.py."""
    cluster = Cluster.resolve(project, cluster)
    name = cluster.name
    outputs = load_outputs(project, name, outputs_file)
    out = console()
    states = wait_ready(cluster.deployed(outputs), timeout_s, out)
    out.print(readiness_table(states, f"{name}: {sum(s.ready for s in states)}/{len(states)} ready"))
    require_ready(states, timeout_s)
