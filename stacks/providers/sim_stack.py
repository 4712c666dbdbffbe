"""The sim cluster construct: one built-in `terraform_data` per node whose provisioners run fatpipe sim node-up/down."""

from __future__ import annotations

import shlex
import sys

from fatpipe.infra.errors import ConfigError
from fatpipe.infra.node import READY_FILE
from fatpipe.infra.spec import FIRST_HOST_OFFSET
from fatpipe.stacks.sim.net import link_names, loopback_ip, netns_usable

from ..literals import literal, literal_map
from ..toolkit import LocalExecProvisioner, TerraformResource
from .construct import ClusterConstruct

# Terraform runs in cdktf.out/stacks/<name>/ (terraform -chdir, cdktf deploy): the project root
# is three folders up, and node folders are given relative to it so the JSON holds no host path.
ROOT_FROM_STACK_DIR = "../../.."

# Each input key becomes the node-up/node-down option --<key with dashes>.
NODE_KEYS = ("cluster", "index", "isolation", "address", "tier", "rate_gbit", "node_dir",
             "netns", "bridge", "host_if", "transport")
# Only the nodes of a cluster across regions have these (node-down needs them too: the region's
# uplink goes with its last node); a one-region node's input is as it was.
REGION_KEYS = ("region", "cross_gbit", "flow_gbit")


def resolve_isolation(isolation: str, transport: str = "netns") -> str:
    """`auto` becomes netns when this process can create namespaces, else loopback."""
    if isolation == "loopback":
        return "loopback"
    if netns_usable():
        return "netns"
    if isolation == "netns" or transport == "ssh":
        what = 'transport = "ssh"' if transport == "ssh" else 'isolation = "netns"'
        raise ConfigError(f'{what} needs root and `ip netns`; use isolation = "loopback" or "auto"')
    return "loopback"


def node_input(cluster, index: int, isolation: str) -> dict:
    """What node-up and node-down need, as the terraform_data input (destroy may read only self)."""
    name = cluster.node_name(index)
    node = {
        "cluster": cluster.name,
        "index": index,
        "isolation": isolation,
        "tier": cluster.tier,
        "rate_gbit": cluster.link_rate_gbps,
        "node_dir": f".fatpipe/{cluster.name}/nodes/{name}",
        "netns": "",
        "bridge": "",
        "host_if": "",
        "transport": cluster.transport if isolation == "netns" else "local",
    }
    if node["transport"] == "ssh":  # a stand-in for a rented machine: its host firewall too,
        # which keeps the run's ports for the cluster's nodes (infra.firewall.firewall_plan)
        node.update(firewall=cluster.firewall, nodes=cluster.nodes, rdzv_port=cluster.rdzv_port)
    if isolation == "netns":
        prefix = cluster.private_cidr.split("/")[1]
        region = cluster.region_of(index)
        node.update(link_names(cluster.name, index, region), address=f"{cluster.private_ip(index)}/{prefix}")
        if cluster.regions > 1:
            node.update(region=region, cross_gbit=cluster.cross_region_gbps,
                        flow_gbit=cluster.cross_region_flow_gbps or 0.0)
    else:
        node["address"] = loopback_ip(cluster.private_cidr, index, FIRST_HOST_OFFSET) + "/8"
    return node


def node_command(action: str, extra: tuple[str, ...] = ()) -> str:
    """`<python> -m fatpipe.cli sim node-<action>` with every option taken from self.input."""
    # node-down needs no transport: leaving it out keeps nodes deployed before it existed
    # (their state has no such input key) removable. `extra`: keys only some nodes have (the
    # region's reach node-down too).
    down = tuple(k for k in NODE_KEYS if k != "transport") + tuple(k for k in extra if k in REGION_KEYS)
    keys = (*NODE_KEYS, *extra) if action == "up" else down
    options = " ".join(f"--{key.replace('_', '-')}=${{self.input.{key}}}" for key in keys)
    # The interpreter's absolute path is baked in at synth time: fine for a stack that only
    # ever runs on the machine that synthesized it.
    return f"{literal(shlex.quote(sys.executable))} -m fatpipe.cli sim node-{action} {options}"


def node_output(cluster, project, node: dict) -> dict:
    ip = node["address"].split("/")[0]
    out = {
        "name": cluster.node_name(node["index"]),
        "private_ip": ip,
        "public_ip": None,
        "transport": "netns" if node["isolation"] == "netns" else "local",
        "ready_file": str(project.root / node["node_dir"] / "ready.json"),
    }
    if node["isolation"] == "netns":
        out["netns"] = node["netns"]
    if "region" in node:
        out["region"] = f"r{node['region']}"
    if node["transport"] == "ssh":
        # Reached as a rented machine is: sshd on its private IP, the cluster's key, and the
        # node's files below its own folder (it shares this machine's filesystem).
        root = project.root / node["node_dir"] / "root"
        out.update(transport="ssh", ssh_host=ip, ssh_port=22, ssh_user="root",
                   ssh_key_file=str(project.root / ".fatpipe" / cluster.name / "ssh" / "id_ed25519"),
                   remote_dir=str(root / "home" / "fatpipe"), ready_file=f"{root}{READY_FILE}")
    return out


class SimClusterConstruct(ClusterConstruct):
    """One `terraform_data` per node (`nodes`), whose provisioners make and remove the node."""

    def __init__(self, scope, id: str, *, cluster, project):
        super().__init__(scope, id)
        isolation = resolve_isolation(cluster.isolation, cluster.transport)
        self.nodes, outputs = [], []
        for index in range(cluster.nodes):
            node = node_input(cluster, index, isolation)
            extra = tuple(key for key in ("firewall", "nodes", "rdzv_port", *REGION_KEYS) if key in node)
            resource = TerraformResource(
                self, f"node-{index}",
                terraform_resource_type="terraform_data",
                provisioners=[
                    LocalExecProvisioner(type="local-exec", command=node_command("up", extra),
                                         working_dir=ROOT_FROM_STACK_DIR),
                    LocalExecProvisioner(type="local-exec", command=node_command("down", extra),
                                         when="destroy", working_dir=ROOT_FROM_STACK_DIR),
                ],
            )
            resource.add_override("input", literal_map(node))
            # Any change to a node (tier, address, isolation) replaces it: input alone would not.
            resource.add_override("triggers_replace", literal_map(node))
            self.nodes.append(resource)
            outputs.append(node_output(cluster, project, node))
        guarded = {"firewall": cluster.firewall} if isolation == "netns" and cluster.transport == "ssh" else {}
        if cluster.regions > 1:
            guarded["cross_region_gbps"] = cluster.cross_region_gbps
        self.output = cluster.output(outputs, isolation=isolation, **guarded)
