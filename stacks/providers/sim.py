"""The sim: nodes on this machine (network namespaces on shaped links, or loopback addresses)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from fatpipe.infra.catalog import Estimate, MachineType
from fatpipe.stacks.simnet import SIM_MTU

from .base import Provider


class Sim(Provider):
    name = "sim"
    mtu = SIM_MTU
    user_data_limit = 64 * 1024
    paid = False

    def construct(self, scope, cluster, project):
        from .sim_stack import SimClusterConstruct

        return SimClusterConstruct(scope, "cluster_resources", cluster=cluster, project=project)

    def machine(self, cluster, root: Path | None = None) -> MachineType:
        return MachineType("local", float(cluster.tier_gbps), float(cluster.tier_gbps),
                           vcpus=os.cpu_count() or 1, memory_gib=0.0, price_hourly=0.0)

    def estimate(self, cluster, root: Path | None = None) -> Estimate:
        return Estimate("local", float(cluster.tier_gbps), 0.0, "sim: this machine")

    def sweep(self, project, cluster_name: str, log) -> list[str]:
        """Remove namespaces whose destroy provisioner never ran (a tainted or failed node)."""
        from fatpipe.stacks.simnet import sweep_cluster

        nodes_dir = project.state_dir(cluster_name) / "nodes"
        swept = sweep_cluster(cluster_name, nodes_dir, log) if os.geteuid() == 0 else []
        for leftover in swept:
            log(f"{cluster_name}: removed leftover {leftover}")
        shutil.rmtree(nodes_dir, ignore_errors=True)
        return swept


SIM = Sim()
