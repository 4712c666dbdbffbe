"""`fatpipe netcheck [CLUSTER]`: prove the links deliver the tier (all-reduce, p2p, latency) and gate on it."""

from __future__ import annotations

import click

from fatpipe.infra.defaults import P2P_TOOLS
from fatpipe.infra.runs import load_outputs
from fatpipe.ops.net.check import NetcheckOptions
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.run.guard import refuse_if_running
from fatpipe.trainer.net.bench import parse_size

from .netstep import netcheck_step
from .options import (
    cluster_argument,
    console,
    force_option,
    outputs_option,
    pass_project,
    pass_request,
    remote_python_option,
)
from .signals import changing


def _size(ctx, param, value):
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@click.command()
@cluster_argument
@click.option("--min-fraction", type=click.FloatRange(0, 1, min_open=True), default=0.8, show_default=True,
              help="Pass when busbw at the largest size and every pair reach this fraction of the tier.")
@click.option("--no-gate", is_flag=True, help="Report only: exit 0 even when the links fall short.")
@click.option("--max-size", default=None, callback=_size,
              help="Largest all-reduce of the sweep, e.g. 64M  [default: 256M; with --quick from the tier]")
@click.option("--min-size", default=None, callback=_size,
              help="Smallest all-reduce  [default: 1M; with --quick the largest size only]")
@click.option("--quick", is_flag=True,
              help="One all-reduce size the tier makes rate-bound (32M at 1 Gbit/s on 4 nodes), few iterations, "
                   "one 1 s multi-stream p2p run per node: the busbw the gate and comm=auto read "
                   "(`up --netcheck quick`).")
@click.option("--streams", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Parallel TCP streams of the multi-stream p2p test.")
@click.option("--p2p-seconds", type=click.FloatRange(1, 60), default=3.0, show_default=True,
              help="Length of each p2p run.")
@click.option("--p2p-tool", type=click.Choice(P2P_TOOLS), default="auto", show_default=True,
              help="auto: iperf3 where every node has it, else the built-in socket test.")
@click.option("--pairs", is_flag=True,
              help="Also every node pair, in rounds of pairs that share no node: throughput, latency "
                   "and jitter as a matrix naming the worst link; each pair is gated too.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1), default=None,
              help="Stop the benchmark after this many seconds  [default: estimated from the sizes and the "
                   "tier; slow nodes, such as emulated VMs on a busy host, may need more]")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None,
              help="Run folder for netcheck.json (default: a new one under .fatpipe/<cluster>/runs/).")
@outputs_option
@remote_python_option
@click.option("-v", "--verbose", is_flag=True, help="Stream every node's output.")
@force_option
@pass_project
@pass_request
def netcheck(project, request, cluster, no_gate, run_dir, outputs_file, verbose, **measure):
    """Measure all-reduce busbw, node-to-node TCP and latency on every node; exit 1 below the bar."""
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
