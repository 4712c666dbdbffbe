"""The ssh cluster construct: one built-in `terraform_data` per host whose provisioners apply the
node profile over SSH (`fatpipe ssh-node apply`) and revert it on destroy. The host's values
reach them as environment (FATPIPE_HOST_*), never as shell text.

Why OpenSSH (through local-exec) and not Terraform's own SSH communicator: the communicator
skips host-key checking unless each key is typed in, and ignores ~/.ssh/config, so jump hosts
and aliases would work in every later phase but this one. One SSH client for every phase, with
the cluster's own known_hosts, keeps all of them the same.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from fatpipe.infra.node import DEFAULT_REMOTE_DIR, UNIT

from ..literals import literal, literal_map
from ..toolkit import LocalExecProvisioner, TerraformResource
from .construct import ClusterConstruct
from .sim_stack import ROOT_FROM_STACK_DIR

# Each input key reaches `fatpipe ssh-node` as the variable FATPIPE_HOST_<KEY>. Host values
# travel as environment, never as command text: the command is a constant run without a shell.
HOST_KEYS = ("name", "address", "port", "user", "key_file", "known_hosts", "private_ip")
HOST_ENV_PREFIX = "FATPIPE_HOST_"
PROFILE_ENV = "FATPIPE_NODE_PROFILE"


def host_interpreter() -> list[str]:
    """What local-exec runs with the action as its last argument: argv, no /bin/sh -c."""
    return [literal(sys.executable), "-m", "fatpipe.cli", "ssh-node"]


def host_environment(keys: tuple[str, ...]) -> dict[str, str]:
    """Each host value as a reference to the resource's own input (destroy may read only self)."""
    return {f"{HOST_ENV_PREFIX}{key.upper()}": f"${{self.input.{key}}}" for key in keys}


class SshClusterConstruct(ClusterConstruct):
    """The hosts (`hosts`, one terraform_data each) and the `cluster` output that reaches them."""

    def __init__(self, scope, id: str, *, cluster, profile: dict, project_id: str):
        super().__init__(scope, id)
        digest = hashlib.sha256(json.dumps(profile, sort_keys=True).encode()).hexdigest()[:16]
        self.hosts, nodes = [], []
        for index, host in enumerate(cluster.hosts):
            name = cluster.node_name(index)
            remote_dir = host.remote_dir or DEFAULT_REMOTE_DIR.format(cluster=cluster.name)
            values = {
                "name": name, "address": host.address, "port": host.port,
                "user": host.user or cluster.ssh_user,
                "key_file": str(Path(cluster.ssh_key_file).expanduser()) if cluster.ssh_key_file else "",
                "known_hosts": f".fatpipe/{cluster.name}/known_hosts", "private_ip": host.private_ip,
                "remote_dir": remote_dir,
            }
            resource = TerraformResource(
                self, f"host-{index}", terraform_resource_type="terraform_data",
                provisioners=[
                    LocalExecProvisioner(type="local-exec", command="apply", interpreter=host_interpreter(),
                                         working_dir=ROOT_FROM_STACK_DIR,
                                         environment={**host_environment(HOST_KEYS),
                                                      PROFILE_ENV: literal(json.dumps(profile))}),
                    LocalExecProvisioner(type="local-exec", when="destroy", command="revert",
                                         interpreter=host_interpreter(), working_dir=ROOT_FROM_STACK_DIR,
                                         environment={**host_environment((*HOST_KEYS, "remote_dir")),
                                                      f"{HOST_ENV_PREFIX}UNIT": literal(UNIT),
                                                      # whose folder `down` may remove (ops.reach.projectdir)
                                                      f"{HOST_ENV_PREFIX}CLUSTER": literal(cluster.name),
                                                      f"{HOST_ENV_PREFIX}PROJECT_ID": literal(project_id)}),
                ],
            )
            resource.add_override("input", literal_map(values))
            # A new tier, host or login applies the profile anew (revert first, then apply).
            resource.add_override("triggers_replace", literal_map({**values, "profile": digest}))
            self.hosts.append(resource)
            nodes.append({"name": name, "private_ip": host.private_ip, "public_ip": None,
                          "ssh_host": host.address, "ssh_port": host.port, "ssh_user": values["user"],
                          "ssh_key_file": values["key_file"] or None, "remote_dir": remote_dir,
                          "transport": "ssh"})
        self.output = cluster.output(nodes, firewall=cluster.firewall)
