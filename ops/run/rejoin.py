"""`fatpipe launch CLUSTER --rejoin NODE`: start one node of a live run again.

Under fault_tolerance = "live" a run goes on without a node that died (docs/ARCHITECTURE.md,
"Live fault tolerance"). A node whose wrapper started it again rejoins by itself; one that did
not come back (its restarts used up, a rebooted machine, a node `fatpipe deploy` made again) is
started here: the project, the node venv and torchft made ready as a launch makes them, then
its wrapper started with the run's own rendezvous. Its trainer joins at the next quorum and is
sent the live state by a peer, not from a checkpoint.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fatpipe.infra.errors import FatpipeError

from ..env.nodeenv import probe_node
from ..rdzv.noderun import NodeRun, run_nodes
from ..reach.cluster import Cluster
from .follow import read_end
from .launch import start_nodes
from .prepare import prepare_envs, prepare_node


def rejoin_node(cluster: Cluster, name: str) -> tuple[str, Path]:
    """Start node `name` again in the cluster's latest run; (run id, run folder). Refused in one
    line unless the run is live, the node is not running it, and another node still is."""
    outputs, log = cluster.outputs, cluster.log
    run_id, run_dir, nodes = run_nodes(cluster)
    rdzv = nodes[0].rdzv
    if not rdzv.live:
        raise FatpipeError(f"run {run_id} runs with fault_tolerance = \"{rdzv.fault_tolerance}\": "
                           "--rejoin starts a node of a live run (torchrun restarts the others)")
    node = next((n for n in nodes if n.name == name), None)
    if node is None:
        raise FatpipeError(f"run {run_id} has no node {name!r}: its nodes are "
                           f"{', '.join(n.name for n in nodes)}")
    node = at_current_address(node, cluster)
    end = read_end(node)
    if end.state == "running":
        raise FatpipeError(f"{name} is still running run {run_id}: nothing to rejoin")
    if end.state == "unreachable":
        raise FatpipeError(f"{name} cannot be reached ({end.why}): `fatpipe deploy {outputs.name}` "
                           "makes a node that is gone again")
    if not any(read_end(n).state == "running" for n in nodes if n.name != name):
        raise FatpipeError(f"run {run_id} runs on no other node: start a new run, which resumes "
                           "from the checkpoints")
    prepare_node(cluster, node, run_dir, rdzv.gpus_per_node)
    prepare_envs(cluster, [node], rdzv.gpus_per_node)
    report = probe_node(node)
    if not report.get("torchft"):
        raise FatpipeError(f"{name}: no torchft for Python {report.get('python')} on "
                           f"{report.get('machine')}: it cannot rejoin a live run")
    start_nodes([node])
    log(f"{name} started again in run {run_id}: it joins at the next quorum")
    return run_id, run_dir


def at_current_address(node: NodeRun, cluster: Cluster) -> NodeRun:
    """The node as the cluster's outputs have it now: a node made again may have a new public
    address (reached there); its private address is in every peer's plan, so it must not move."""
    outputs = cluster.outputs
    now = next((n for n in outputs.nodes if n.name == node.name), None)
    if now is None:
        raise FatpipeError(f"{node.name} is not in cluster {outputs.name}'s outputs: deploy it first")
    if now.private_ip != node.plan.private_ip:
        raise FatpipeError(f"{node.name}'s private address changed ({node.plan.private_ip} -> "
                           f"{now.private_ip}) since the run started: start a new run")
    plan = dataclasses.replace(node.plan, public_ip=now.public_ip)
    return NodeRun(node.rdzv, plan, cluster.transport(plan, provider=node.rdzv.provider))
