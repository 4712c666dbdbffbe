"""`fatpipe deploy [CLUSTER]`: apply the cluster's stack and write .fatpipe/<cluster>/outputs.json."""

from __future__ import annotations

import click

from .options import (
    cluster_argument,
    console,
    engine_option,
    force_option,
    given,
    pass_project,
    replace_option,
    verbose_option,
    yes_option,
)
from .signals import changing
from .steps import deploy_outputs


@click.command()
@cluster_argument
@engine_option
@yes_option
@replace_option
@verbose_option
@force_option
@pass_project
def deploy(project, cluster: str | None, engine: str, yes: bool, replace: bool, verbose: bool):
    """Create the cluster's nodes and write its outputs (the input of every later command)."""
    from fatpipe.infra.runs import outputs_file
    from fatpipe.ops.env.preflight import wheel_preflight
    from fatpipe.ops.run.runguard import refuse_if_running

    out = console()
    name = project.cluster(cluster).name
    with changing(project, name, "deploy"):
        # An apply may change or replace the nodes a run is on: only a live run rides that out; a
        # node out of reach may be running one (--force goes on).
        going = refuse_if_running(project, name, live_ok=True, force=given("force"))
        if going:
            out.print(going, soft_wrap=True, highlight=False, markup=False)
        wheel = wheel_preflight(project, project.cluster(name))  # before anything is paid for
        if wheel:
            out.print(wheel)
        try:
            outputs = deploy_outputs(project, name, engine, yes, verbose, replace)
        except KeyboardInterrupt:
            out.print(f"[yellow]interrupted[/]: the engine stopped and saved its state; `fatpipe deploy {name}` "
                      f"finishes the deployment, `fatpipe down {name}` removes what it made", soft_wrap=True)
            raise
    for node in outputs.nodes:
        where = node.netns or node.public_ip or node.transport
        out.print(f"  {node.name:<20} {node.private_ip:<15} {where}")
    out.print(f"{outputs.name}: {len(outputs.nodes)} node(s) up, "
              f"outputs in {outputs_file(project, outputs.name)}")
