"""`fatpipe launch [CLUSTER] [-- SCRIPT ARGS]`: run torchrun on every node and stream their logs."""

from __future__ import annotations

import sys

from fatpipe.infra.errors import FatpipeError
from fatpipe.ops.rdzv.noderun import node_runs
from fatpipe.ops.rdzv.rendezvous import read_rendezvous
from fatpipe.ops.reach.cluster import Cluster
from fatpipe.ops.run.checks import ask_launch_checks, latest_nodes, remove_fresh_run
from fatpipe.ops.run.detach import DETACHED, let_go
from fatpipe.ops.run.guard import refuse_if_running
from fatpipe.ops.run.launch import Follow
from fatpipe.ops.run.rejoin import rejoin_node

from .newrun import open_run
from .options import Request, console, pass_project, pass_request
from .signals import changing
from .steps import train_on_cluster


@pass_project
@pass_request
def launch(project, request: Request, cluster: str | None, run_id, outputs_file, rejoin, **follow_flags):
    """The body of `fatpipe launch`; its options and help are declared in train_commands.py."""
    cluster = Cluster.resolve(project, cluster)  # the one lookup: every stage gets this object
    name = cluster.name
    cluster = cluster.deployed(cluster.load_outputs(outputs_file))
    if rejoin:
        return rejoin_one(cluster, request, rejoin, run_id)
    with changing(project, name, "launch", request.on_signal) as release:
        previous = latest_nodes(cluster)  # the run a second one must not collide with
        if run_id:
            if request.script or request.overrides:
                raise FatpipeError("--run starts a rendezvous as written; give no script or [train] overrides")
            run_id, run_dir = cluster.find_run(run_id)
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
