"""`fatpipe launch [CLUSTER] [-- SCRIPT ARGS]`: run torchrun on every node and stream their logs."""

from __future__ import annotations

import sys

import click

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.runs import find_run, load_outputs
from fatpipe.ops.rdzv.noderun import node_runs
from fatpipe.ops.rdzv.rendezvous import read_rendezvous
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.run.checks import ask_launch_checks, latest_nodes, remove_fresh_run
from fatpipe.ops.run.detach import DETACHED, let_go
from fatpipe.ops.run.guard import refuse_if_running
from fatpipe.ops.run.launch import Follow
from fatpipe.ops.run.rejoin import rejoin_node

from .newrun import open_run
from .options import (
    Request,
    ScriptCommand,
    cluster_argument,
    console,
    force_option,
    on_signal_option,
    pass_project,
    pass_request,
    run_options,
    train_overrides,
    unreachable_option,
)
from .signals import changing
from .steps import train_on_cluster


@click.command(cls=ScriptCommand)
@cluster_argument
@click.option("--run", "run_id", default=None,
              help="Start this run's rendezvous (from `fatpipe rendezvous`) instead of a new one.")
@train_overrides
@run_options
@click.option("--timeout", "timeout_s", type=click.FloatRange(1), default=None,
              help="Stop every node after this many seconds (exit 124).")
@click.option("--detach", is_flag=True, help="Start and return; follow later with `fatpipe logs -f`.")
@click.option("--rejoin", "rejoin", metavar="NODE", default=None,
              help="Start NODE again in the latest run, live (fault_tolerance = \"live\"), and return.")
@unreachable_option
@on_signal_option
@force_option
@click.option("-v", "--verbose", is_flag=True,
              help="Show every node's every line (third-party logging; under live, each node's steps).")
@pass_project
@pass_request
def launch(project, request: Request, cluster: str | None, run_id, outputs_file, rejoin, **follow_flags):
    """Sync, start torchrun on every node, stream the logs; exit with the worst node's status.

    Everything after `--` is your torchrun script and its arguments (e.g. `-- train.py --lr 3e-4`);
    without it, the built-in trainer runs with [train] and the overrides given here. Ctrl-C typed
    at the terminal stops the run on every node. A termination (SIGTERM, SIGHUP) lets go of it:
    exit 76, the run goes on (unless --on-signal stop). A lost connection does not stop it either:
    the follow reconnects, and past --unreachable-timeout exits 75 while the run goes on
    (`fatpipe logs -f` reattaches).
    `--rejoin NODE` starts one node of a live run again (one whose restarts ran out, or made
    again by `fatpipe deploy`) and returns once it is started.
    """
    cluster = Cluster.resolve(project, cluster)  # the one lookup: every stage gets this object
    name = cluster.name
    cluster = cluster.deployed(load_outputs(project, name, outputs_file))
    if rejoin:
        return rejoin_one(cluster, request, rejoin, run_id)
    with changing(project, name, "launch", request.on_signal) as release:
        previous = latest_nodes(cluster)  # the run a second one must not collide with
        if run_id:
            if request.script or request.overrides:
                raise FatpipeError("--run starts a rendezvous as written; give no script or [train] overrides")
            run_id, run_dir = find_run(project, name, run_id)
            rdzv = read_rendezvous(run_dir)
        else:
            rdzv, run_dir = open_run(cluster, request)
        nodes = node_runs(rdzv, cluster)  # made once: every stage below takes them
        try:  # one call per node answers every check below (ops/run/checks.py)
            ask_launch_checks(cluster, nodes, previous)
            going = refuse_if_running(cluster, previous, force=request.force)
        except BaseException:
            cluster.answers.forget_all()
            if not run_id:
                remove_fresh_run(run_dir)
            raise
        if going:  # --force past a node out of reach
            console().print(going, soft_wrap=True, highlight=False, markup=False)
        try:
            # A live run's follow holds no lock: a lost node may be deployed again and rejoin.
            flags = follow_flags  # timeout_s, detach, unreachable_s, verbose: how the run is followed
            follow = Follow(flags["timeout_s"], flags["unreachable_s"], flags["detach"],
                            release if rdzv.live else None, signal_detaches=True)
            result = train_on_cluster(cluster, nodes, run_dir, console(), follow, flags["verbose"])
        finally:
            cluster.answers.forget_all()
    sys.exit(DETACHED if let_go(result.unknown) else result.exit_code)


def rejoin_one(cluster: Cluster, request: Request, node: str, run_id) -> None:
    """--rejoin NODE: that node of the latest live run started again (ops/run/rejoin.py)."""
    if run_id or request.script or request.overrides:
        raise FatpipeError("--rejoin starts a node of the latest run as it was started: give no "
                           "--run, script or [train] overrides")
    out = console()
    with changing(cluster.project, cluster.name, "launch"):
        try:
            rejoin_node(cluster.logging(lambda line: out.print(line, soft_wrap=True, highlight=False,
                                                               markup=False)), node)
        finally:
            cluster.answers.forget_all()
