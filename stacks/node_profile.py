"""The node profile: a node's cloud-init user data (network tuning for its tier, tools, a ready marker)."""

from __future__ import annotations

import json
import shlex

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.node import (
    MODULES_FILE,
    NCCL_CONF,
    NET_ENV,
    NET_SCRIPT,
    READY_FILE,
    READY_SCRIPT,
    SYSCTL_FILE,
    UNIT,
    UNIT_FILE,
)
from fatpipe.infra.tiers import TierProfile, tier_profile

# The seed's monitoring tools, plus what fatpipe itself needs on a node: iperf3 for netcheck,
# rsync to ship code, python3-venv for the trainer's environment.
PACKAGES = ("htop", "iftop", "net-tools", "mtr-tiny", "iperf3", "rsync", "python3-venv")

# Runs at every boot (a systemd unit), because an MTU set by hand does not survive a reboot.
# The private NIC is the one that holds an address inside the cluster's private network;
# names such as ens5/eth1 differ between providers and instance generations.
NET_SCRIPT_TEXT = """\
#!/bin/sh
# fatpipe: find the NIC holding this node's private IP, set its MTU, publish it to NCCL/gloo.
set -eu
CIDR={cidr}
MTU={mtu}
found=$(python3 -c '
import ipaddress, json, subprocess, sys
net = ipaddress.ip_network(sys.argv[1])
for link in json.loads(subprocess.check_output(["ip", "-j", "-4", "addr", "show"])):
    for a in link.get("addr_info", []):
        if ipaddress.ip_address(a["local"]) in net:
            print(link["ifname"], a["local"]); sys.exit(0)
sys.exit("no interface holds an address in " + sys.argv[1])
' "$CIDR")
IFACE=${{found% *}}
ADDR=${{found#* }}
ip link set dev "$IFACE" mtu "$MTU" || echo "fatpipe-net: could not set MTU $MTU on $IFACE" >&2
# default_qdisc = fq reaches only qdiscs made after it was set, and the NIC's were made at
# boot: drop its root so the kernel attaches the default again (fq, or mq with fq per queue).
tc qdisc del dev "$IFACE" root 2>/dev/null || true
mkdir -p /etc/fatpipe
# NCCL_SOCKET_IFNAME=ens5 is a prefix (ens5, ens50, ...); a leading = makes it exact.
# GLOO_SOCKET_IFNAME takes one exact name.
printf 'FATPIPE_IFACE=%s\\nFATPIPE_PRIVATE_IP=%s\\nNCCL_SOCKET_IFNAME==%s\\nGLOO_SOCKET_IFNAME=%s\\n' \\
    "$IFACE" "$ADDR" "$IFACE" "$IFACE" > {net_env}
# NCCL reads /etc/nccl.conf at init; the tier's socket settings are already in it.
sed -i '/^NCCL_SOCKET_IFNAME=/d' {nccl_conf}
echo "NCCL_SOCKET_IFNAME==$IFACE" >> {nccl_conf}
# pam_env applies /etc/environment to SSH sessions too, so `ssh node torchrun ...` sees these.
sed -i '/^NCCL_SOCKET_IFNAME=/d; /^GLOO_SOCKET_IFNAME=/d' /etc/environment
printf 'NCCL_SOCKET_IFNAME==%s\\nGLOO_SOCKET_IFNAME=%s\\n' "$IFACE" "$IFACE" >> /etc/environment
"""

# The last step: read back what the kernel actually applied, so `fatpipe wait` can compare it
# with the tier's declared values instead of trusting that every step above worked.
READY_SCRIPT_TEXT = """\
#!/usr/bin/env python3
\"\"\"fatpipe: write {ready} with the network settings as read back from this node.\"\"\"
import json, os, pathlib, subprocess, time

SYSCTLS = {names}
PACKAGES = {packages}


def read(name):
    r = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True)
    return " ".join(r.stdout.split()) if r.returncode == 0 else None


def installed(package):
    r = subprocess.run(["dpkg-query", "-W", "-f=${{Status}}", package], capture_output=True, text=True)
    return r.stdout.strip() == "install ok installed"


def qdisc(iface):
    r = subprocess.run(["tc", "qdisc", "show", "dev", iface], capture_output=True, text=True)
    return [line.split()[1] for line in r.stdout.splitlines() if len(line.split()) > 1]


def keyvalues(path):
    p = pathlib.Path(path)
    return dict(l.split("=", 1) for l in p.read_text().split() if "=" in l) if p.exists() else {{}}


env = keyvalues("{net_env}")
iface = env.get("FATPIPE_IFACE")
mtu_file = pathlib.Path(f"/sys/class/net/{{iface}}/mtu")
doc = {{
    "tier": "{tier}",
    "sysctls": {{name: read(name) for name in SYSCTLS}},
    "iface": iface,
    "private_ip": env.get("FATPIPE_PRIVATE_IP"),
    "mtu": int(mtu_file.read_text()) if iface and mtu_file.exists() else None,
    # What really paces the NIC: `wait` refuses a node whose root qdisc is not fq (or mq of fq).
    "qdisc": qdisc(iface) if iface else [],
    # apt may have failed at boot (no egress yet): `wait` refuses a node without these.
    "packages": {{name: installed(name) for name in PACKAGES}},
    "bbr_available": "bbr" in (read("net.ipv4.tcp_available_congestion_control") or "").split(),
    "nccl": keyvalues("{nccl_conf}"),
    "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
}}
out = pathlib.Path("{ready}")
out.parent.mkdir(parents=True, exist_ok=True)
tmp = out.with_suffix(".tmp")
tmp.write_text(json.dumps(doc, indent=1) + "\\n")
os.replace(tmp, out)
"""

UNIT_TEXT = f"""\
[Unit]
Description=fatpipe: MTU and NCCL/gloo interface of the private network
After=network-online.target
Wants=network-online.target

[Service]
Type=oneshot
ExecStart={NET_SCRIPT}
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
"""


def sysctl_conf(profile: TierProfile) -> str:
    lines = [f"# fatpipe tier {profile.name}: TCP sized for {profile.gbps} Gbit/s"]
    lines += [f"{name} = {value}" for name, value in profile.sysctls.items()]
    return "\n".join(lines) + "\n"


def nccl_conf(nccl: dict[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in nccl.items())


def net_script(cidr: str, mtu: int) -> str:
    return NET_SCRIPT_TEXT.format(
        cidr=shlex.quote(cidr), mtu=int(mtu), net_env=NET_ENV, nccl_conf=NCCL_CONF
    )


def ready_script(profile: TierProfile) -> str:
    return READY_SCRIPT_TEXT.format(
        ready=READY_FILE, names=json.dumps(list(profile.sysctls)), net_env=NET_ENV,
        nccl_conf=NCCL_CONF, tier=profile.name, packages=json.dumps(list(PACKAGES)),
    )


def cloud_config(cluster, mtu: int, nccl: dict[str, str]) -> dict:
    """The cloud-config document (a dict) for every node of `cluster`: its private NIC at `mtu`,
    NCCL's settings `nccl`."""
    profile = tier_profile(cluster.tier)

    def file(path, content, mode="0644"):
        return {"path": path, "content": content, "permissions": mode, "owner": "root:root"}

    return {
        "package_update": True,
        "packages": list(PACKAGES),
        "write_files": [
            file(SYSCTL_FILE, sysctl_conf(profile)),
            file(MODULES_FILE, "tcp_bbr\nsch_fq\n"),
            file(NCCL_CONF, nccl_conf(nccl)),
            file(NET_SCRIPT, net_script(cluster.private_cidr, mtu), "0755"),
            file(UNIT_FILE, UNIT_TEXT),
            file(READY_SCRIPT, ready_script(profile), "0755"),
        ],
        # runcmd runs after packages are installed; the ready marker is written last.
        "runcmd": [
            ["modprobe", "tcp_bbr"],
            ["modprobe", "sch_fq"],
            ["sysctl", "--system"],
            ["systemctl", "daemon-reload"],
            ["systemctl", "enable", "--now", UNIT],
            [READY_SCRIPT],
        ],
    }


def render_cloud_init(cluster, mtu: int, limit: int, nccl: dict[str, str] | None = None) -> str:
    """User data for `cluster`'s nodes: `#cloud-config` followed by the document as JSON.

    JSON is valid YAML, so cloud-init reads it as is, and no YAML library or quoting rules
    stand between the scripts above and the node. The same text serves every node: each one
    finds its own private NIC at boot.
    """
    nccl = tier_profile(cluster.tier).nccl if nccl is None else nccl
    text = "#cloud-config\n" + json.dumps(cloud_config(cluster, mtu, nccl), indent=1) + "\n"
    if len(text.encode()) > limit:
        raise FatpipeError(f"user data for {cluster.name} is {len(text.encode())} bytes; {cluster.provider} allows {limit}")
    return text
