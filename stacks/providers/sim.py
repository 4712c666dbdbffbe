"""The sim: nodes on this machine (network namespaces on shaped links, or loopback addresses)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from fatpipe.infra.catalog import Estimate, MachineType
from fatpipe.infra.lazy import load
from fatpipe.stacks.sim.links import netns_exists
from fatpipe.stacks.sim.net import SIM_MTU, leftover_netns, sweep_cluster

from .base import Provider


class Sim(Provider):
    name = "sim"
    mtu = SIM_MTU
    user_data_limit = 64 * 1024
    paid = False

    def construct(self, scope, cluster, project):
        SimClusterConstruct = load("fatpipe.stacks.providers.sim_stack").SimClusterConstruct  # the CDK: a synth's alone
        return SimClusterConstruct(scope, "cluster_resources", cluster=cluster, project=project)

    def warnings(self, cluster) -> list[str]:
        if cluster.link_gbps is not None and cluster.link_gbps != cluster.tier_gbps:
            return [f"{cluster.name}: links shaped to {cluster.link_gbps:g} Gbit/s (link_gbps), not "
                    f"tier {cluster.tier}'s {cluster.tier_gbps} Gbit/s: netcheck's gate still "
                    "judges them against the tier"]
        return []

    def machine(self, cluster, root: Path | None = None) -> MachineType:
        return MachineType("local", float(cluster.tier_gbps), float(cluster.tier_gbps),
                           vcpus=os.cpu_count() or 1, memory_gib=0.0, price_hourly=0.0)

    def estimate(self, cluster, root: Path | None = None) -> Estimate:
        return Estimate("local", float(cluster.tier_gbps), 0.0, "sim: this machine")

    def sweep(self, project, cluster_name: str, log) -> list[str]:
        """Remove this project's namespaces whose destroy provisioner never ran (a tainted or
        failed node, a node-up cut short); another project's of the same names stay."""
        nodes_dir = project.state_dir(cluster_name) / "nodes"
        swept = sweep_cluster(cluster_name, nodes_dir, log, project.project_id) if os.geteuid() == 0 else []
        for leftover in swept:
            log(f"{cluster_name}: removed leftover {leftover}")
        shutil.rmtree(nodes_dir, ignore_errors=True)
        return swept

    def left_alone(self, cluster_name: str) -> list[str]:
        """Namespaces named like the cluster's nodes still there after its sweep: another project's."""
        return leftover_netns(cluster_name)

    def vanished_nodes(self, project, outputs) -> list[str]:
        return vanished_nodes(outputs)


def vanished_nodes(outputs) -> list[str]:
    """Nodes of deployed sim `outputs` that are gone from this machine although terraform's state
    still holds them (a reboot clears namespaces; someone ran `ip netns del` or removed .fatpipe/)."""
    if outputs.provider != "sim":
        return []
    gone = []
    for node in outputs.nodes:
        # A loopback node is its folder (which holds the ready file); a netns node, its namespace.
        missing_ns = node.transport == "netns" and not netns_exists(node.netns or "")
        if missing_ns or (node.ready_file and not Path(node.ready_file).parent.is_dir()):
            gone.append(node.name)
    return gone


SIM = Sim()
