"""Make and remove sim nodes: a network namespace on a shaped veth link, or a loopback address."""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.files import write_json_atomic
from fatpipe.infra.project import project_id_at
from fatpipe.infra.tiers import tier_profile

from .links import (
    NODE_IFACE,
    apply_sysctls,
    bridge_lock,
    bridge_ports,
    ensure_bridge,
    host_sysctl,
    kill_netns_processes,
    link_exists,
    link_mtu,
    netns_exists,
    netns_list,
    run,
    shape_link,
    tbf_burst_bytes,
)
from .owner import OWNER_FILE, describe_owner, mark_owner, owns
from .regions import region_link_names, sweep_bridges, uplink_down, uplink_up

SIM_MTU = 1500  # a veth on a bridge, like the plain Ethernet of most VPS networks

@dataclass(frozen=True)
class SimNode:
    """Everything node-up and node-down need, as recorded in the node's terraform_data input."""

    cluster: str
    index: int
    isolation: str  # netns | loopback
    address: str  # "10.42.0.10/24" (netns) or "127.42.0.10/8" (loopback)
    tier: str
    rate_gbit: float
    node_dir: Path  # holds ready.json; relative paths resolve against the project root
    netns: str = ""
    bridge: str = ""
    host_if: str = ""
    project_id: str | None = None  # whose node this is: the project folder's .fatpipe/project-id
    # False: a bare machine (the sim reached over ssh): the node profile tunes it over SSH, and
    # records the kernel's defaults first, so `down` restores them.
    tune: bool = True
    # A cluster across regions: this node's region (-1: one region), the rate of the link
    # between regions and each flow's cap on it (0: none) (stacks/sim/regions.py).
    region: int = -1
    cross_gbit: float = 0.0
    flow_gbit: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.cluster}-{self.index}"

    @property
    def ip(self) -> str:
        return self.address.split("/")[0]

    @property
    def ready_file(self) -> Path:
        return self.node_dir / "ready.json"

    @property
    def region_links(self) -> dict[str, str] | None:
        if self.region < 0:
            return None
        return region_link_names(cluster_digest(self.cluster), self.region)

    @property
    def home_bridge(self) -> str:
        """Where this machine takes an address to reach every node (ssh transport): the WAN
        bridge across regions, else the cluster's bridge."""
        links = self.region_links
        return links["wan"] if links else self.bridge


def cluster_digest(cluster: str) -> str:
    return hashlib.sha1(cluster.encode()).hexdigest()[:6]


def link_names(cluster: str, index: int, region: int = 0) -> dict[str, str]:
    """Namespace, bridge (its region's) and host-side veth names; interface names stay within
    IFNAMSIZ (15)."""
    digest = cluster_digest(cluster)
    return {
        "netns": f"fp-{cluster}-{index}",
        "bridge": region_link_names(digest, region)["bridge"],
        "host_if": f"fpv{digest}-{index}",
    }


def loopback_ip(private_cidr: str, index: int, first_offset: int) -> str:
    """127.<low 24 bits of the network> + offset + index: unique per cluster, all routed to lo."""
    net = ipaddress.IPv4Network(private_cidr)
    low = int(net.network_address) & 0xFFFFFF
    return str(ipaddress.IPv4Address((127 << 24) + low + first_offset + index))


@functools.cache
def netns_usable() -> bool:
    """True when this process may create network namespaces (root and a working `ip netns`).

    Asked once per process; `run` keeps a Ctrl-C from killing the probe (a killed probe would
    read as "no namespaces")."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        return False
    probe = f"fp-probe-{os.getpid()}"
    ok = run(["ip", "netns", "add", probe], check=False).returncode == 0
    run(["ip", "netns", "del", probe], check=False)
    return ok


# --- node up / down -----------------------------------------------------------------------


def node_up(node: SimNode, log=print) -> dict:
    """Create the node and write its ready file last; on failure remove what was made.

    A namespace of the same name is taken over only when it is this project's (a leftover);
    another project's (a same-named cluster deployed from another folder) is refused.
    """
    if node.isolation == "loopback":
        return _loopback_up(node)
    if netns_exists(node.netns):
        if not owns(node.netns, node.node_dir, node.project_id):
            raise FatpipeError(
                f"network namespace {node.netns} exists but is not this project's node "
                f"({describe_owner(node.netns)}): `fatpipe down {node.cluster}` in the folder that "
                f"deployed it, or give this cluster another name; `ip netns del {node.netns}` if it is stale"
            )
        log(f"{node.name}: removing a leftover namespace {node.netns}")
        node_down(node, log)
    # The owner record comes first: a node-up killed half way leaves a namespace still known as ours.
    write_json_atomic(node.node_dir / OWNER_FILE, {"project_id": node.project_id, "node": node.name})
    try:
        return _netns_up(node)
    except BaseException:
        node_down(node, log)
        raise


def node_down(node: SimNode, log=print) -> None:
    """Remove the node; safe to repeat, and removes the bridge with the cluster's last node.

    Another project's namespace of the same name is left alone (only our own folder goes).
    """
    if node.isolation == "netns":
        if netns_exists(node.netns) and not owns(node.netns, node.node_dir, node.project_id):
            log(f"{node.name}: leaving {node.netns} alone: {describe_owner(node.netns)}")
        else:
            if netns_exists(node.netns):
                kill_netns_processes(node.netns, log)
                run(["ip", "netns", "del", node.netns], check=False)
            # Deleting the namespace destroys the pair; this catches a host end left by a failed up.
            run(["ip", "link", "del", node.host_if], check=False)
        with bridge_lock(node.bridge):
            if node.region_links:
                uplink_down(node.region_links)
            elif link_exists(node.bridge) and not bridge_ports(node.bridge):
                run(["ip", "link", "del", node.bridge], check=False)
    shutil.rmtree(node.node_dir, ignore_errors=True)


def reshape_node(cluster: str, index: int, rate_gbit: float) -> None:
    """Set the link of node `index` of a deployed sim cluster to `rate_gbit`, both directions.

    Replaces the qdiscs in place (a slow node, a link cut mid-run), so `fatpipe down` removes
    the node as usual.
    """
    names = link_names(cluster, index)
    shape_link(names["netns"], names["host_if"], rate_gbit)


def _netns_up(node: SimNode) -> dict:
    profile = tier_profile(node.tier)
    mtu = SIM_MTU
    ns = ["ip", "-n", node.netns]
    run(["ip", "netns", "add", node.netns])
    mark_owner(node.netns, node.project_id)
    run(ns + ["link", "set", "lo", "up"])  # gloo and torchrun bind to loopback too
    run(["ip", "link", "add", node.host_if, "mtu", str(mtu), "type", "veth",
          "peer", "name", NODE_IFACE, "mtu", str(mtu), "netns", node.netns])
    with bridge_lock(node.bridge):
        ensure_bridge(node.bridge)
        run(["ip", "link", "set", node.host_if, "master", node.bridge, "up"])
        if node.region_links:
            uplink_up(node.region_links, node.cross_gbit, node.flow_gbit or None)
    run(ns + ["addr", "add", node.address, "dev", NODE_IFACE])
    run(ns + ["link", "set", NODE_IFACE, "up"])
    shape_link(node.netns, node.host_if, node.rate_gbit)
    sysctls = apply_sysctls(node.netns, profile.sysctls if node.tune else {})
    ready = {
        "node": node.name,
        "isolation": "netns",
        "netns": node.netns,
        "private_ip": node.ip,
        "iface": NODE_IFACE,
        "mtu": link_mtu(NODE_IFACE, node.netns),
        "rate_gbit": node.rate_gbit,
        "qdisc": {"kind": "tbf", "burst_bytes": tbf_burst_bytes(node.rate_gbit)},
        "tier": node.tier,
        "project_id": node.project_id,
        **sysctls,
    }
    if node.region_links:
        ready["region"] = {"index": node.region, "cross_gbit": node.cross_gbit, "flow_gbit": node.flow_gbit or None}
    write_json_atomic(node.ready_file, ready)
    return ready


def _loopback_up(node: SimNode) -> dict:
    """Nothing to create: Linux routes all of 127/8 to lo. Report the host's values, unapplied."""
    sysctls = {}
    for name in tier_profile(node.tier).sysctls:
        value = host_sysctl(name)
        if value is not None:
            sysctls[name] = value
    ready = {
        "node": node.name,
        "isolation": "loopback",
        "private_ip": node.ip,
        "iface": "lo",
        "mtu": link_mtu("lo"),
        "rate_gbit": None,  # unshaped
        "tier": node.tier,
        "project_id": node.project_id,
        "sysctls": sysctls,
        "namespaced": [],
        "not_namespaced": [],
        "skipped": sorted(sysctls),  # loopback isolation changes nothing on the host
        "failed": {},
    }
    write_json_atomic(node.ready_file, ready)
    return ready


# --- sweeping up a whole cluster ------------------------------------------------------------


def leftover_netns(cluster: str) -> list[str]:
    """Namespaces named like this cluster's nodes that still exist (whoever's they are)."""
    pattern = re.compile(rf"^fp-{re.escape(cluster)}-\d+$")
    return [name for name in netns_list() if pattern.match(name)]


def sweep_cluster(cluster: str, nodes_dir: Path, log=print, project_id: str | None = None) -> list[str]:
    """Remove this project's namespaces and the bridge left by `cluster` (after a destroy that
    missed some); another project's namespaces of the same names stay. Returns what was removed.

    `project_id` defaults to the id of the project in the working folder (where terraform runs
    node-up, and where a test's project lives).
    """
    if project_id is None:
        project_id = project_id_at(Path.cwd(), create=False)
    removed = []
    for ns in leftover_netns(cluster):
        index = int(ns.rsplit("-", 1)[1])
        node = SimNode(cluster, index, "netns", "", "", 0, nodes_dir / f"{cluster}-{index}",
                       **link_names(cluster, index), project_id=project_id)
        if not owns(node.netns, node.node_dir, node.project_id):
            log(f"{cluster}: left {ns} alone: {describe_owner(ns)}")
            continue
        node_down(node, log)
        removed.append(ns)
    removed += sweep_bridges(cluster_digest(cluster))
    return removed
