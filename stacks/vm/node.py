"""Make and remove one `vm` node: a qcow2 overlay on the base image, a NoCloud seed carrying a cloud's
user data and the cluster's key, a tap on the cluster's bridge shaped to the link, and QEMU
(docs/ARCHITECTURE.md, "The vm provider")."""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.files import write_json_atomic

from ..sim.links import bridge_lock, bridge_ports, ensure_bridge, link_exists, run, tbf_args
from ..sim.sshd import cluster_key, host_address
from .accel import resolve_accel
from .image import BaseImage, build_image
from .seed import vendor_data
from .wheels import wheel_disk

STOP_TIMEOUT_S = 10


@dataclass(frozen=True)
class VmNode:
    """Everything node-up and node-down need, as recorded in the node's terraform_data input."""

    name: str
    address: str  # "10.42.0.10/24"
    mac: str
    rate_gbit: float
    mtu: int  # the user data's provider's MTU: the tap and bridge carry it
    node_dir: Path  # overlay, seed, console log, QEMU's pid; relative to the project root
    bridge: str
    tap: str
    accel: str = "auto"  # auto | kvm | tcg
    vcpus: int = 1
    memory_mib: int = 1024
    cache: str = ""  # the image cache folder
    wheels: str = ""  # JSON: the wheel disk's requirements and index (stacks/vm/wheels.py)
    rtt_ms: float = 0.0  # the cluster's round trip, as netem inside the guest (stacks/vm/seed.py)
    peer_rtt_ms: tuple[tuple[str, float], ...] = ()  # (peer IP, round trip) where not rtt_ms (regions)
    peer_gbps: tuple[tuple[str, float], ...] = ()  # (peer IP, Gbit/s it may send) (cross_region_gbps)

    @property
    def ip(self) -> str:
        return self.address.split("/")[0]


def vm_names(project_id: str, cluster: str, index: int) -> dict[str, str]:
    """Bridge, tap (within IFNAMSIZ, 15) and MAC; the project's id keeps two projects' apart."""
    digest = hashlib.sha1(f"{project_id}/{cluster}".encode()).hexdigest()[:6]
    mac_bytes = hashlib.sha1(f"{project_id}/{cluster}/{index}".encode()).digest()[:3]
    return {"bridge": f"fpvb-{digest}", "tap": f"fpt{digest}-{index}",
            "mac": "52:54:00:" + ":".join(f"{b:02x}" for b in mac_bytes)}


def node_up(node: VmNode, user_data: str, log=print) -> None:
    """Start the VM (QEMU daemonizes); the guest's cloud-init writes the ready marker later.
    On failure whatever was made is removed."""
    if os.geteuid() != 0:
        raise FatpipeError("vm nodes need root (a tap on a bridge)")
    image = build_image(Path(node.cache), log)
    wheels = _wheel_disk(node, log)
    node_down(node, log)  # a leftover of the same node (a failed up, a lost state) goes first
    node_dir = node.node_dir.resolve()
    node_dir.mkdir(parents=True, exist_ok=True)
    write_record(node)
    try:
        key = cluster_key(node_dir.parent.parent, node.bridge)
        _overlay(image, node_dir)
        _seed(node, user_data, Path(f"{key}.pub").read_text(), node_dir, wheels is not None)
        _tap(node)
        _qemu(node, image, resolve_accel(node.accel, image, log), node_dir, wheels)
    except BaseException:
        node_down(node, log)
        raise


def node_down(node: VmNode, log=print) -> None:
    """Stop QEMU, remove the tap, the node's files and, with the cluster's last tap, the bridge."""
    node_dir = node.node_dir.resolve()
    _stop_qemu(node_dir / "qemu.pid", node.name, log)
    if link_exists(node.tap):
        run(["ip", "link", "del", node.tap], check=False)
    with bridge_lock(node.bridge):
        if link_exists(node.bridge) and not bridge_ports(node.bridge):
            run(["ip", "link", "del", node.bridge], check=False)
    shutil.rmtree(node_dir, ignore_errors=True)


def _wheel_disk(node: VmNode, log) -> Path | None:
    """The cluster's wheel disk (built once, cached), or None for a node given no requirements."""
    if not node.wheels:
        return None
    try:
        wanted = json.loads(node.wheels)
        requirements, index = list(map(str, wanted["requirements"])), list(map(str, wanted["index"]))
    except (ValueError, KeyError, TypeError):
        raise FatpipeError("fatpipe vm: FATPIPE_VM_WHEELS is not the stack's JSON (requirements, index)") from None
    return wheel_disk(Path(node.cache), requirements, index, log)


def _overlay(image: BaseImage, node_dir: Path) -> None:
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(image.disk),
         str(node_dir / "disk.qcow2")])


def _seed(node: VmNode, user_data: str, public_key: str, node_dir: Path, wheels: bool) -> None:
    """The NoCloud seed: the cloud's user data as is, the key as the clouds' metadata gives it,
    and the private NIC found by its MAC (JSON is YAML)."""
    seed = node_dir / "seed"
    seed.mkdir(exist_ok=True)
    (seed / "user-data").write_text(user_data)
    meta = {"instance-id": f"{node.name}-{os.urandom(4).hex()}", "local-hostname": node.name,
            "public-keys": [public_key.strip()]}
    (seed / "meta-data").write_text(json.dumps(meta, indent=1) + "\n")
    network = {"version": 2, "ethernets": {"private": {
        "match": {"macaddress": node.mac}, "addresses": [node.address]}}}
    (seed / "network-config").write_text(json.dumps(network, indent=1) + "\n")
    (seed / "vendor-data").write_text(vendor_data(wheels, node.mac, node.rtt_ms, dict(node.peer_rtt_ms),
                                                       dict(node.peer_gbps)))
    run(["cloud-localds", "-N", str(seed / "network-config"), "-V", str(seed / "vendor-data"),
         str(node_dir / "seed.img"), str(seed / "user-data"), str(seed / "meta-data")])


def _tap(node: VmNode) -> None:
    """The VM's NIC on the host: a tap on the cluster's bridge, which holds this machine's own
    address in the private network (so SSH reaches the VMs). Shaped on the tap's egress, which
    is the VM's ingress: every flow between VMs crosses the shaper of its receiver."""
    run(["ip", "tuntap", "add", "dev", node.tap, "mode", "tap"])
    run(["ip", "link", "set", node.tap, "mtu", str(node.mtu)])
    with bridge_lock(node.bridge):
        ensure_bridge(node.bridge)
        run(["ip", "link", "set", node.bridge, "mtu", str(node.mtu)], check=False)
        run(["ip", "link", "set", node.tap, "master", node.bridge, "up"])
    host_address(node.bridge, node.address)
    run(["tc", "qdisc", "replace", "dev", node.tap, "root"] + tbf_args(node.rate_gbit))


def _qemu(node: VmNode, image: BaseImage, accel: str, node_dir: Path, wheels: Path | None) -> None:
    argv = ["qemu-system-x86_64", "-name", f"fatpipe-{node.name}", "-accel", accel,
            "-cpu", "host" if accel == "kvm" else "max", "-smp", str(node.vcpus), "-m", str(node.memory_mib),
            "-nodefaults", "-no-user-config", "-display", "none",
            "-serial", f"file:{node_dir / 'console.log'}",
            "-kernel", str(image.kernel), "-initrd", str(image.initrd),
            "-append", "root=/dev/vda rw console=ttyS0",
            "-drive", f"file={node_dir / 'disk.qcow2'},if=virtio,format=qcow2",
            "-drive", f"file={node_dir / 'seed.img'},if=virtio,format=raw,readonly=on",
            # Shared by every VM of the cluster: read-only, so no guest can change it.
            *(["-drive", f"file={wheels},if=virtio,format=raw,readonly=on"] if wheels else []),
            "-netdev", f"tap,id=private,ifname={node.tap},script=no,downscript=no",
            "-device", f"virtio-net-pci,netdev=private,mac={node.mac}",
            "-daemonize", "-pidfile", str(node_dir / "qemu.pid")]
    run(argv)


def _stop_qemu(pid_file: Path, name: str, log) -> None:
    """TERM the node's QEMU (only if the pid still is that QEMU), then KILL after a grace."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        pid = int(pid_file.read_text().strip())
        deadline = time.monotonic() + STOP_TIMEOUT_S
        sig = signal.SIGTERM
        while _is_our_qemu(pid, name):
            if time.monotonic() > deadline:
                sig = signal.SIGKILL
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            time.sleep(0.2)


def _is_our_qemu(pid: int, name: str) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"fatpipe-{name}".encode() in argv


def node_address(private_cidr: str, ip: str) -> str:
    return f"{ip}/{ipaddress.IPv4Network(private_cidr).prefixlen}"


def write_record(node: VmNode) -> None:
    """What a sweep needs to remove the node when its destroy provisioner never runs."""
    write_json_atomic(node.node_dir / "node.json", {**asdict(node), "node_dir": str(node.node_dir)})


def sweep_cluster(project, cluster_name: str, log) -> list[str]:
    """Remove every node of the cluster still recorded under its folder; return their names."""
    nodes_dir = project.state_dir(cluster_name) / "nodes"
    removed = []
    for record in sorted(nodes_dir.glob("*/node.json")):
        with contextlib.suppress(OSError, ValueError, TypeError):
            values = json.loads(record.read_text())
            node = VmNode(**{**values, "node_dir": Path(values["node_dir"])})
            node_down(node, log)
            log(f"{cluster_name}: removed leftover {node.name}")
            removed.append(node.name)
    shutil.rmtree(nodes_dir, ignore_errors=True)
    return removed


def vanished_vms(nodes_dir: Path, outputs) -> list[str]:
    """Nodes of deployed vm `outputs` whose QEMU is no longer running (a reboot, a kill)."""
    gone = []
    for node in outputs.nodes:
        try:
            pid = int((nodes_dir / node.name / "qemu.pid").read_text().strip())
        except (OSError, ValueError):
            pid = 0
        if not (pid and _is_our_qemu(pid, node.name)):
            gone.append(node.name)
    return gone
