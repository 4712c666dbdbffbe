"""Your own machines: VPS rented anywhere, reached over SSH. fatpipe tunes them, and untunes them
on `down`; it never creates or deletes a machine."""

from __future__ import annotations

from pathlib import Path

from fatpipe.infra.catalog import Estimate, MachineType
from fatpipe.infra.lazy import load
from fatpipe.stacks.node_profile import profile_plan

from .base import Provider


class Ssh(Provider):
    name = "ssh"
    mtu = 0  # unused: an ssh cluster's `mtu` (default: leave the machine's) goes to the profile
    user_data_limit = 0  # no user data: the profile is applied over SSH
    paid = False  # nothing is rented by fatpipe

    def construct(self, scope, cluster, project):
        SshClusterConstruct = load("fatpipe.stacks.providers.ssh_stack").SshClusterConstruct  # the CDK: a synth's alone
        plan = profile_plan(cluster, cluster.mtu, self.nccl_env(cluster), packages=cluster.install_packages)
        return SshClusterConstruct(scope, "cluster_resources", cluster=cluster, profile=plan,
                                   project_id=project.project_id)

    def machine(self, cluster, root: Path | None = None) -> MachineType:
        return MachineType("your machines", None, None, vcpus=0, memory_gib=0.0)

    def estimate(self, cluster, root: Path | None = None) -> Estimate:
        # What they carry is what you declared (the tier); netcheck measures it.
        return Estimate("your machines", float(cluster.tier_gbps), None, "ssh: machines you already rent",
                        "declared")


SSH = Ssh()
