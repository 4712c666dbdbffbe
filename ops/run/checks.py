"""A launch's checks of each node, in one call per node before anything moves (docs/ARCHITECTURE.md, "Inside ops").

Whether the previous run still runs there, whether its firewall is in place, the project folder
claimed with the folders the pushes fill, the venv's stamp and the node's versions: one node
program per node (ops/reach/asknode.py), all nodes at once. Each stage then takes its answer
(`refuse_if_running`, `require_firewall`, `prepare_node`, `build_node_envs`, `check_node_envs`)
instead of asking the node itself; a node whose venv is built again is asked for its versions
after the build.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.node import REMOTE_VENV

from ..env.nodeenv import probe_step
from ..env.projectsync import look_step, pushed_paths
from ..env.venvs import stamp_step
from ..rdzv.noderun import NodeRun, run_nodes
from ..reach.asknode import Step, ask_ahead, brought, kept
from ..reach.cluster import Cluster
from ..reach.firewall_check import LISTING
from ..reach.projectdir import claim_step
from ..reach.transport import fan_out
from ..reach.wait import declared_sysctls, readiness_step
from .leader import leader
from .prepare import push_excludes, pushed_folders
from .progress import progress_step

# The project push's look travels in the first call while its paths fit well inside one
# argument of `python3 -c` (the kernel's limit for one is 128 KiB).
LOOK_BYTES = 64 * 1024


def launch_steps(node: NodeRun, cluster: Cluster, firewall: bool, previous: NodeRun | None) -> list[Step]:
    """What a launch will ask `node`, in the order the stages ask it."""
    project = cluster.project
    steps = [previous.status_step()] if previous is not None else []
    if firewall:
        # The claim after the listing makes nothing on a node the listing shows without a
        # firewall, and a launch the verdict refuses removes what the claims made on the other
        # nodes (firewall_check.require_firewall): one call still, nothing left behind.
        steps.append(LISTING)
    if not node.transport.shares_fs:
        steps.append(claim_step(node.plan.workdir, node.rdzv.cluster, project.project_id, pushed_folders(node)))
        paths = pushed_paths(project.root, push_excludes(cluster, node))
        if len(repr(json.dumps(paths))) < LOOK_BYTES:  # a larger project asks on its own
            steps.append(look_step(node.plan.workdir, paths))
        if node.plan.python == f"{REMOTE_VENV}/bin/python":
            steps.append(stamp_step(node))
    if not kept(node.transport, probe_step(node)):  # `up`'s netcheck launch read it already
        steps.append(probe_step(node))
    return steps


def ask_launch_checks(cluster: Cluster, nodes: list[NodeRun], previous: list[NodeRun] = (),
                      firewall: bool | None = None) -> None:
    """Ask every node of the run (`nodes`) everything its launch checks, once; the stages take the answers.

    `previous`: the nodes of the cluster's latest run, whose state decides whether a launch is
    refused (`refuse_if_running`); `firewall` False: checked already (netcheck's gate)."""
    before = {n.name: n for n in previous}
    firewall = bool(cluster.outputs.firewall) if firewall is None else firewall
    # A step asked already in this command (`fatpipe launch` asks before its rendezvous is used)
    # is not asked again; a node with nothing left to ask is not called.
    def ask_rest(n: NodeRun) -> None:
        rest = [s for s in launch_steps(n, cluster, firewall, before.get(n.name)) if not brought(n.transport, s)]
        if rest:
            ask_ahead(n.transport, rest)

    fan_out(ask_rest, nodes)


def latest_nodes(cluster: Cluster) -> list[NodeRun]:
    """The nodes of the cluster's latest run (none yet: [])."""
    try:
        return run_nodes(cluster)[2]
    except FatpipeError:
        return []


def remove_fresh_run(run_dir: Path) -> None:
    """A run folder this launch made, refused before anything started: no clutter left."""
    shutil.rmtree(run_dir, ignore_errors=True)


def ask_status_checks(cluster: Cluster) -> None:
    """`fatpipe status`'s one call per node: its readiness, the latest run's state there and, on
    its leader, the run's progress (ops/run/progress.py)."""
    outputs = cluster.outputs
    declared = declared_sysctls(outputs)
    try:
        _, run_dir, run = run_nodes(cluster)
    except FatpipeError:
        run_dir, run = None, []
    states = {n.name: [n.status_step()] for n in run}
    if run and not run[0].transport.shares_fs:
        head = leader(run, run_dir)
        states[head.name].append(progress_step(head))
    transports = cluster.transports()
    fan_out(lambda i: ask_ahead(transports[i], [readiness_step(outputs.nodes[i], declared),
                                                *states.get(outputs.nodes[i].name, [])]),
            list(range(len(outputs.nodes))))
