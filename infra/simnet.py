"""Make and remove sim nodes: a network namespace on a shaped veth link, or a loopback address."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import FatpipeError
from .files import write_json_atomic

NODE_IFACE = "eth0"  # the node's end of its veth, inside the namespace
LOCK_DIR = Path("/run/fatpipe")
KILL_GRACE_S = 5.0

# Run inside the namespace: apply each sysctl the kernel namespaces (its file exists under this
# namespace's /proc/sys), read every one back. argv[1] is {name: value} as JSON.
_SYSCTL_SCRIPT = r"""
import json, sys
want = json.loads(sys.argv[1]); out = {"values": {}, "namespaced": [], "absent": [], "failed": {}}
for name, value in want.items():
    path = "/proc/sys/" + name.replace(".", "/")
    try:
        open(path).close()
    except OSError:
        out["absent"].append(name); continue
    try:
        with open(path, "w") as f: f.write(value)
        out["namespaced"].append(name)
    except OSError as e:
        out["failed"][name] = e.strerror or str(e)
    with open(path) as f: out["values"][name] = " ".join(f.read().split())
print(json.dumps(out))
"""


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

    @property
    def name(self) -> str:
        return f"{self.cluster}-{self.index}"

    @property
    def ip(self) -> str:
        return self.address.split("/")[0]

    @property
    def ready_file(self) -> Path:
        return self.node_dir / "ready.json"


def link_names(cluster: str, index: int) -> dict[str, str]:
    """Namespace, bridge and host-side veth names; interface names stay within IFNAMSIZ (15)."""
    digest = hashlib.sha1(cluster.encode()).hexdigest()[:6]
    return {
        "netns": f"fp-{cluster}-{index}",
        "bridge": f"fpbr-{digest}",
        "host_if": f"fpv{digest}-{index}",
    }


def loopback_ip(private_cidr: str, index: int, first_offset: int) -> str:
    """127.<low 24 bits of the network> + offset + index: unique per cluster, all routed to lo."""
    net = ipaddress.IPv4Network(private_cidr)
    low = int(net.network_address) & 0xFFFFFF
    return str(ipaddress.IPv4Address((127 << 24) + low + first_offset + index))


def netns_usable() -> bool:
    """True when this process may create network namespaces (root and a working `ip netns`)."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        return False
    probe = f"fp-probe-{os.getpid()}"
    ok = _run(["ip", "netns", "add", probe], check=False).returncode == 0
    _run(["ip", "netns", "del", probe], check=False)
    return ok


def tbf_burst_bytes(rate_gbit: float) -> int:
    """About 4 ms of traffic at the rate (500 KB at 1 Gbit/s, 5 MB at 10), at least 64 KiB.

    The sustained rate is the tier either way (iperf3 reads 0.956 of 1 Gbit/s, the TCP ceiling).
    The bucket only lets a link catch up after a sender lost the CPU for a few ms: on a shared
    2-core machine that stall, not the link, held a 4-node gloo ring at 0.93 of the tier with
    a 1 ms bucket; with 4 ms it reaches 0.95, as separate machines would.
    """
    return max(int(rate_gbit * 1e9 / 8 / 250), 64 * 1024)


def tbf_args(rate_gbit: float) -> list[str]:
    return ["tbf", "rate", f"{int(rate_gbit * 1e9)}bit", "burst", str(tbf_burst_bytes(rate_gbit)),
            "latency", "20ms"]


# --- node up / down -----------------------------------------------------------------------


def node_up(node: SimNode, log=print) -> dict:
    """Create the node and write its ready file last; on failure remove what was made."""
    if node.isolation == "loopback":
        return _loopback_up(node)
    if _netns_exists(node.netns):
        if not node.node_dir.exists():
            raise FatpipeError(
                f"network namespace {node.netns} exists but is not this project's node "
                f"(another cluster named {node.cluster} on this machine?); remove it with "
                f"`ip netns del {node.netns}` if it is stale"
            )
        log(f"{node.name}: removing a leftover namespace {node.netns}")
        node_down(node, log)
    node.node_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _netns_up(node)
    except BaseException:
        node_down(node, log)
        raise


def node_down(node: SimNode, log=print) -> None:
    """Remove the node; safe to repeat, and removes the bridge with the cluster's last node."""
    if node.isolation == "netns":
        if _netns_exists(node.netns):
            _kill_netns_processes(node.netns, log)
            _run(["ip", "netns", "del", node.netns], check=False)
        # Deleting the namespace destroys the pair; this catches a host end left by a failed up.
        _run(["ip", "link", "del", node.host_if], check=False)
        with _bridge_lock(node.bridge):
            if _link_exists(node.bridge) and not _bridge_ports(node.bridge):
                _run(["ip", "link", "del", node.bridge], check=False)
    shutil.rmtree(node.node_dir, ignore_errors=True)


def shape_link(netns: str, host_if: str, rate_gbit: float) -> None:
    """Shape a node's veth to `rate_gbit` (tc tbf) in both directions, replacing any qdisc there."""
    # The host end's egress is the node's ingress; the namespace end's egress is its egress.
    _run(["tc", "qdisc", "replace", "dev", host_if, "root"] + tbf_args(rate_gbit))
    _run(["tc", "-n", netns, "qdisc", "replace", "dev", NODE_IFACE, "root"] + tbf_args(rate_gbit))


def _netns_up(node: SimNode) -> dict:
    from .tiers import tier_profile

    profile = tier_profile(node.tier)
    mtu = profile.mtu("sim")
    ns = ["ip", "-n", node.netns]
    _run(["ip", "netns", "add", node.netns])
    _run(ns + ["link", "set", "lo", "up"])  # gloo and torchrun bind to loopback too
    _run(["ip", "link", "add", node.host_if, "mtu", str(mtu), "type", "veth",
          "peer", "name", NODE_IFACE, "mtu", str(mtu), "netns", node.netns])
    with _bridge_lock(node.bridge):
        _ensure_bridge(node.bridge)
        _run(["ip", "link", "set", node.host_if, "master", node.bridge, "up"])
    _run(ns + ["addr", "add", node.address, "dev", NODE_IFACE])
    _run(ns + ["link", "set", NODE_IFACE, "up"])
    shape_link(node.netns, node.host_if, node.rate_gbit)
    sysctls = _apply_sysctls(node.netns, profile.sysctls)
    ready = {
        "node": node.name,
        "isolation": "netns",
        "netns": node.netns,
        "private_ip": node.ip,
        "iface": NODE_IFACE,
        "mtu": _link_mtu(NODE_IFACE, node.netns),
        "rate_gbit": node.rate_gbit,
        "qdisc": {"kind": "tbf", "burst_bytes": tbf_burst_bytes(node.rate_gbit)},
        "tier": node.tier,
        **sysctls,
    }
    write_json_atomic(node.ready_file, ready)
    return ready


def _loopback_up(node: SimNode) -> dict:
    """Nothing to create: Linux routes all of 127/8 to lo. Report the host's values, unapplied."""
    from .tiers import tier_profile

    sysctls = {}
    for name in tier_profile(node.tier).sysctls:
        value = _host_sysctl(name)
        if value is not None:
            sysctls[name] = value
    ready = {
        "node": node.name,
        "isolation": "loopback",
        "private_ip": node.ip,
        "iface": "lo",
        "mtu": _link_mtu("lo"),
        "rate_gbit": None,  # unshaped
        "tier": node.tier,
        "sysctls": sysctls,
        "namespaced": [],
        "not_namespaced": [],
        "skipped": sorted(sysctls),  # loopback isolation changes nothing on the host
        "failed": {},
    }
    write_json_atomic(node.ready_file, ready)
    return ready


def _apply_sysctls(netns: str, wanted: dict[str, str]) -> dict:
    """Apply in the namespace what the kernel namespaces; report the host's value for the rest."""
    proc = _run(["ip", "netns", "exec", netns, sys.executable, "-c", _SYSCTL_SCRIPT,
                 json.dumps(wanted)])
    result = json.loads(proc.stdout)
    values = result["values"]
    for name in result["absent"]:  # global: the host's value is the one sockets here get
        value = _host_sysctl(name)
        if value is not None:
            values[name] = value
    return {
        "sysctls": values,
        "namespaced": result["namespaced"],
        "not_namespaced": result["absent"],
        "failed": result["failed"],  # namespaced but refused (e.g. above the host's limit)
    }


# --- sweeping up a whole cluster ------------------------------------------------------------


def leftover_netns(cluster: str) -> list[str]:
    """Namespaces named like this cluster's nodes that still exist."""
    pattern = re.compile(rf"^fp-{re.escape(cluster)}-\d+$")
    return [name for name in _netns_list() if pattern.match(name)]


def sweep_cluster(cluster: str, nodes_dir: Path, log=print) -> list[str]:
    """Remove every namespace and the bridge left by `cluster` (after a destroy that missed some)."""
    removed = []
    for ns in leftover_netns(cluster):
        index = int(ns.rsplit("-", 1)[1])
        names = link_names(cluster, index)
        node_dir = nodes_dir / f"{cluster}-{index}"
        node_down(SimNode(cluster, index, "netns", "", "", 0, node_dir, **names), log)
        removed.append(ns)
    bridge = link_names(cluster, 0)["bridge"]
    if _link_exists(bridge) and not _bridge_ports(bridge):
        _run(["ip", "link", "del", bridge], check=False)
        removed.append(bridge)
    return removed


# --- small wrappers around ip / tc -----------------------------------------------------------


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise FatpipeError(f"`{' '.join(argv[:8])}` failed: {proc.stderr.strip() or proc.returncode}")
    return proc


def _host_sysctl(name: str) -> str | None:
    """The host's value of sysctl `name` (fields single-spaced), or None if it cannot be read."""
    from .tiers import normalize_sysctl

    try:
        return normalize_sysctl(Path("/proc/sys", *name.split(".")).read_text())
    except OSError:
        return None


def _netns_list() -> list[str]:
    # `ip netns list` prints "name (id: N)"; the files under /run/netns are the names.
    with contextlib.suppress(FileNotFoundError):
        return sorted(os.listdir("/run/netns"))
    return []


def _netns_exists(name: str) -> bool:
    return name in _netns_list()


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _bridge_ports(bridge: str) -> list[str]:
    with contextlib.suppress(FileNotFoundError):
        return os.listdir(f"/sys/class/net/{bridge}/brif")
    return []


def _link_mtu(iface: str, netns: str | None = None) -> int:
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-j", "link", "show", iface]
    return int(json.loads(_run(argv).stdout)[0]["mtu"])


def _ensure_bridge(bridge: str) -> None:
    if _link_exists(bridge):
        return
    _run(["ip", "link", "add", bridge, "type", "bridge"])
    # With br_netfilter loaded, bridged frames would cross the host's iptables FORWARD chain
    # (DROP by default where Docker runs): keep the sim's traffic out of it.
    _run(["ip", "link", "set", bridge, "type", "bridge", "nf_call_iptables", "0",
          "nf_call_ip6tables", "0", "nf_call_arptables", "0"], check=False)
    _run(["ip", "link", "set", bridge, "up"])


@contextlib.contextmanager
def _bridge_lock(bridge: str):
    """Nodes come up in parallel (terraform runs provisioners concurrently): one at a time here."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK_DIR / f"{bridge}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _kill_netns_processes(netns: str, log) -> None:
    """TERM what still runs in the namespace (a training run, a benchmark), then KILL."""
    deadline = time.monotonic() + KILL_GRACE_S
    sig = signal.SIGTERM
    while time.monotonic() < deadline + 2:  # then give up: deleting the namespace still works
        pids = [int(p) for p in _run(["ip", "netns", "pids", netns], check=False).stdout.split()]
        if not pids:
            return
        if sig == signal.SIGTERM:
            log(f"{netns}: stopping {len(pids)} process(es) still running there")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        time.sleep(0.1)
