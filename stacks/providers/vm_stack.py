"""The vm cluster construct: one built-in `terraform_data` per VM whose provisioners run
`fatpipe vm node-up/node-down`, as the sim's do; the values travel as environment, not shell text."""

from __future__ import annotations

import json
import os
import sys

from fatpipe.infra.nodespec import node_of
from fatpipe.infra.nodevenv import TORCH_INDEX_ENV, node_venv
from fatpipe.stacks.vm.image import default_cache
from fatpipe.stacks.vm.inputs import BOOT_KEYS, NODE_KEYS, RATE_KEYS, VM_ENV_PREFIX
from fatpipe.stacks.vm.node import node_address, vm_names
from fatpipe.stacks.vm.wheels import index_args, wheel_requirements

from ..literals import literal, literal_map
from ..toolkit import LocalExecProvisioner, TerraformResource
from .construct import ClusterConstruct
from .sim_stack import ROOT_FROM_STACK_DIR


def vm_interpreter() -> list[str]:
    """What local-exec runs with the action as its last argument: argv, no /bin/sh -c."""
    return [literal(sys.executable), "-m", "fatpipe.cli", "vm"]


def vm_environment(keys: tuple[str, ...]) -> dict[str, str]:
    return {f"{VM_ENV_PREFIX}{key.upper()}": f"${{self.input.{key}}}" for key in keys}


def wheels_input(project, cluster) -> str:
    """What the wheel disk holds (stacks/vm/wheels.py): the cluster's node venv's requirements and
    torch's index where one is declared, as JSON (pip gets each item as one argument)."""
    venv = node_venv(project, cluster, 0)  # the guests have no GPUs
    declared = node_of(project.spec.node, cluster).torch_index is not None or bool(os.environ.get(TORCH_INDEX_ENV))
    return json.dumps({"requirements": wheel_requirements(venv), "index": index_args(venv, declared)})


def node_input(cluster, project, index: int, mtu: int, user_data: str) -> dict:
    name = cluster.node_name(index)
    names = vm_names(project.project_id, cluster.name, index)
    cache = str(default_cache())
    return {"name": name, "address": node_address(cluster.private_cidr, cluster.private_ip(index)),
            "rate_gbit": cluster.link_rate_gbps, "mtu": mtu, "node_dir": f".fatpipe/{cluster.name}/nodes/{name}",
            "accel": cluster.accel, "vcpus": cluster.vcpus, "memory_mib": cluster.memory_mib, "cache": cache,
            "wheels": wheels_input(project, cluster), "rtt_ms": cluster.rtt_ms,
            # JSON {peer IP: round trip} (`regions`); "{}" for one region.
            "peer_rtt_ms": json.dumps(cluster.peer_rtt_ms(index), sort_keys=True), "user_data": user_data, **names,
            # JSON {peer IP: Gbit/s} of the peers in other regions (`cross_region_gbps`).
            **({"peer_gbps": json.dumps(cluster.peer_gbps(index), sort_keys=True)}
               if cluster.cross_region_gbps is not None else {})}


def node_output(cluster, project, node: dict) -> dict:
    return {"name": node["name"], "private_ip": node["address"].split("/")[0], "public_ip": None,
            "transport": "ssh", "ssh_host": node["address"].split("/")[0], "ssh_port": 22,
            "ssh_user": cluster.ssh_user,
            "ssh_key_file": str(project.root / ".fatpipe" / cluster.name / "ssh" / "id_ed25519")}


class VmClusterConstruct(ClusterConstruct):
    """One `terraform_data` per VM (`nodes`): node-up starts it, node-down removes every trace."""

    def __init__(self, scope, id: str, *, cluster, project, cloud):
        super().__init__(scope, id)
        # The cloud's user data as its nodes get it.
        user_data = cloud.user_data(cluster)
        self.nodes, outputs = [], []
        for index in range(cluster.nodes):
            node = node_input(cluster, project, index, cloud.mtu, user_data)
            resource = TerraformResource(
                self, f"node-{index}", terraform_resource_type="terraform_data",
                provisioners=[
                    LocalExecProvisioner(type="local-exec", command="node-up", interpreter=vm_interpreter(),
                                         working_dir=ROOT_FROM_STACK_DIR,
                                         environment=vm_environment(
                                             (*NODE_KEYS, *BOOT_KEYS, *(key for key in RATE_KEYS if key in node)))),
                    LocalExecProvisioner(type="local-exec", command="node-down", when="destroy",
                                         interpreter=vm_interpreter(), working_dir=ROOT_FROM_STACK_DIR,
                                         environment=vm_environment(NODE_KEYS)),
                ],
            )
            resource.add_override("input", literal_map(node))
            # Any change (user data, address, size) boots a new VM, as a cloud replaces an instance.
            resource.add_override("triggers_replace", literal_map(node))
            self.nodes.append(resource)
            outputs.append(node_output(cluster, project, node))
        self.output = cluster.output(outputs)
