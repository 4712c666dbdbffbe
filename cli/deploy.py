"""`fatpipe deploy [CLUSTER]`: apply the cluster's stack and write .fatpipe/<cluster>/outputs.json."""

from __future__ import annotations

from fatpipe.infra.runs import outputs_file
from fatpipe.ops.env.preflight import wheel_preflight
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.run.guard import refuse_if_running
from fatpipe.stacks.providers import provider_for

from .deploying import deploy_outputs
from .options import console, pass_project, pass_request
from .signals import changing


@pass_project
@pass_request
def deploy(project, request, cluster: str | None, engine: str, yes: bool, replace: bool, verbose: bool):
    """The body of `fatpipe deploy`; its options and help are declared in cluster_commands.py."""
    out = console()
    cluster = Cluster.resolve(project, cluster)
    name = cluster.name
    with changing(project, name, "deploy"):
        # An apply may change or replace the nodes a run is on: only a live run rides that out; a
        # node out of reach may be running one (--force goes on).
        going = refuse_if_running(cluster, live_ok=True, force=request.force)
        if going:
            out.print(going, soft_wrap=True, highlight=False, markup=False)
        spec = cluster.spec
        provider = provider_for(spec.provider)
        if provider.paid:  # before anything is paid for
            out.print(wheel_preflight(cluster, provider.image_python(spec)))
        try:
            outputs = deploy_outputs(cluster, engine, yes, verbose, replace)
        except KeyboardInterrupt:
            out.print(f"[yellow]interrupted[/]: the engine stopped and saved its state; `fatpipe deploy {name}` "
                      f"finishes the deployment, `fatpipe down {name}` removes what it made", soft_wrap=True)
            raise
    for node in outputs.nodes:
        where = node.netns or node.public_ip or node.transport
        out.print(f"  {node.name:<20} {node.private_ip:<15} {where}")
    out.print(f"{outputs.name}: {len(outputs.nodes)} node(s) up, "
              f"outputs in {outputs_file(project, outputs.name)}")
