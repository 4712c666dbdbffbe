"""The vm provider: local QEMU VMs booted with a cloud's own cloud-init user data (real kernels)."""

from __future__ import annotations

import os
from pathlib import Path

from fatpipe.infra.catalog import Estimate, MachineType
from fatpipe.infra.lazy import load
from fatpipe.stacks.vm.node import sweep_cluster, vanished_vms

from .aws import AWS
from .base import Provider
from .digitalocean import DIGITALOCEAN


class Vm(Provider):
    name = "vm"
    mtu = 1500  # unused: the user data is the cloud's (`user_data`), with that cloud's MTU
    user_data_limit = 64 * 1024
    paid = False

    def construct(self, scope, cluster, project):
        VmClusterConstruct = load("fatpipe.stacks.providers.vm_stack").VmClusterConstruct  # the CDK: a synth's alone
        return VmClusterConstruct(scope, "cluster_resources", cluster=cluster, project=project,
                                  cloud=self.cloud(cluster))

    def cloud(self, cluster) -> Provider:
        """The provider whose user data and MTU the VMs get."""
        return {"aws": AWS, "digitalocean": DIGITALOCEAN}[cluster.user_data]

    def user_data(self, cluster) -> str:
        return self.cloud(cluster).user_data(cluster)

    def nccl_env(self, cluster) -> dict[str, str]:
        return self.cloud(cluster).nccl_env(cluster)

    def machine(self, cluster, root: Path | None = None) -> MachineType:
        return MachineType("local-vm", float(cluster.tier_gbps), float(cluster.tier_gbps),
                           vcpus=cluster.vcpus, memory_gib=cluster.memory_mib / 1024, price_hourly=0.0)

    def estimate(self, cluster, root: Path | None = None) -> Estimate:
        return Estimate("local-vm", float(cluster.tier_gbps), 0.0, "vm: QEMU on this machine")

    def sweep(self, project, cluster_name: str, log) -> list[str]:
        """Nodes whose destroy provisioner never ran (a failed up): their QEMU, tap and bridge."""
        return sweep_cluster(project, cluster_name, log) if os.geteuid() == 0 else []

    def vanished_nodes(self, project, outputs) -> list[str]:
        """A reboot ends every QEMU."""
        return vanished_vms(project.state_dir(outputs.name) / "nodes", outputs)


VM = Vm()
