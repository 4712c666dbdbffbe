"""`fatpipe netcheck [CLUSTER]`: prove the links deliver the tier (all-reduce, p2p, latency) and gate on it."""

from __future__ import annotations

import click

from fatpipe.infra.runs import load_outputs
from fatpipe.ops.net.check import NetcheckOptions
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.run.guard import refuse_if_running
from fatpipe.trainer.net.bench import parse_size

from .netstep import netcheck_step
from .options import console, pass_project, pass_request
from .signals import changing


def size_value(ctx, param, value):
    """--max-size and --min-size as bytes (`64M`), checked as click parses them."""
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@pass_project
@pass_request
def netcheck(project, request, cluster, no_gate, run_dir, outputs_file, verbose, **measure):
    """The body of `fatpipe netcheck`; its options and help are declared in cluster_commands.py."""
    remote_python = measure.pop("remote_python")
    options = NetcheckOptions(enforce=not no_gate, force=request.force, **measure)
    err = console(stderr=True)

    def sink(node: str, line: str) -> None:
        # The sweep rows come from rank 0 as they are measured; the rest only with -v.
        if verbose or line.startswith(("#", " ")):
            err.print(f"{node}: {line}", style="dim", markup=False, soft_wrap=True)

    cluster = Cluster.resolve(project, cluster)
    name = cluster.name
    cluster = cluster.deployed(load_outputs(project, name, outputs_file))
    out = console()
    with changing(project, name, "netcheck"):
        if run_dir:  # without one, the measurement refuses a live run itself
            # It would share the links and the CPUs, and write into that run.
            if going := refuse_if_running(cluster, force=options.force):
                out.print(going, markup=False, highlight=False, soft_wrap=True)
        netcheck_step(cluster, options, out, run_dir=run_dir, sink=sink, remote_python=remote_python)
