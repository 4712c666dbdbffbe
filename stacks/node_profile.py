"""The node profile: a node's cloud-init user data (network tuning for its tier, tools, a ready marker)."""

from __future__ import annotations

import json
import shlex

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.firewall import firewall_plan
from fatpipe.infra.node import (
    MODULES_FILE,
    NCCL_CONF,
    NET_ENV,
    NET_SCRIPT,
    READY_FILE,
    READY_SCRIPT,
    SYSCTL_APPLY_FILE,
    SYSCTL_FILE,
    UNIT,
    UNIT_FILE,
)
from fatpipe.infra.tiers import TierProfile, cluster_profile

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
if [ -n "$MTU" ]; then  # empty: the machine's own network decides (machines fatpipe did not make)
    ip link set dev "$IFACE" mtu "$MTU" || echo "fatpipe-net: could not set MTU $MTU on $IFACE" >&2
fi
# default_qdisc = fq reaches only qdiscs made after it was set, and the NIC's were made at
# boot: replace a default root with fq (a multi-queue NIC's mq is dropped, and the kernel makes
# it again with fq on every queue). A shaper someone installed (tbf, htb, ...) is theirs: it stays.
case "$(tc qdisc show dev "$IFACE" root | awk 'NR == 1 {{print $2}}')" in
    mq) tc qdisc del dev "$IFACE" root 2>/dev/null || true ;;
    pfifo_fast|pfifo|fq_codel|noqueue|"") tc qdisc replace dev "$IFACE" root fq 2>/dev/null || true ;;
esac
# FATPIPE_ROOT: a sim node that shares its host's files keeps them below its own folder.
R="${{FATPIPE_ROOT:-}}"
mkdir -p "$R/etc/fatpipe"
# NCCL_SOCKET_IFNAME=ens5 is a prefix (ens5, ens50, ...); a leading = makes it exact.
# GLOO_SOCKET_IFNAME takes one exact name.
printf 'FATPIPE_IFACE=%s\\nFATPIPE_PRIVATE_IP=%s\\nNCCL_SOCKET_IFNAME==%s\\nGLOO_SOCKET_IFNAME=%s\\n' \\
    "$IFACE" "$ADDR" "$IFACE" "$IFACE" > "$R{net_env}"
# NCCL reads /etc/nccl.conf at init; the tier's socket settings are already in it.
sed -i '/^NCCL_SOCKET_IFNAME=/d' "$R{nccl_conf}"
echo "NCCL_SOCKET_IFNAME==$IFACE" >> "$R{nccl_conf}"
# pam_env applies /etc/environment to SSH sessions too, so `ssh node torchrun ...` sees these.
touch "$R/etc/environment"
sed -i '/^NCCL_SOCKET_IFNAME=/d; /^GLOO_SOCKET_IFNAME=/d' "$R/etc/environment"
printf 'NCCL_SOCKET_IFNAME==%s\\nGLOO_SOCKET_IFNAME=%s\\n' "$IFACE" "$IFACE" >> "$R/etc/environment"
"""

# The last step: read back what the kernel actually applied, so `fatpipe wait` can compare it
# with the tier's declared values instead of trusting that every step above worked.
READY_SCRIPT_TEXT = """\
#!/usr/bin/env python3
\"\"\"fatpipe: write {ready} with the network settings as read back from this node.\"\"\"
import json, os, pathlib, subprocess, time

R = os.environ.get("FATPIPE_ROOT", "")  # a sim node that shares its host's files: its folder
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


env = keyvalues(R + "{net_env}")
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
    "nccl": keyvalues(R + "{nccl_conf}"),
    # Applied over SSH: which sysctls the kernel took, refused or does not have here.
    "sysctl_apply": json.loads(pathlib.Path(R + "{applied}").read_text())
    if pathlib.Path(R + "{applied}").exists() else None,
    "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
}}
out = pathlib.Path(R + "{ready}")
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


def net_script(cidr: str, mtu: int | None) -> str:
    return NET_SCRIPT_TEXT.format(
        cidr=shlex.quote(cidr), mtu="" if mtu is None else int(mtu), net_env=NET_ENV, nccl_conf=NCCL_CONF
    )


def ready_script(profile: TierProfile, packages: tuple[str, ...] = PACKAGES) -> str:
    """The ready marker's writer; it checks that `packages` (those the profile installs) are there."""
    return READY_SCRIPT_TEXT.format(
        ready=READY_FILE, names=json.dumps(list(profile.sysctls)), net_env=NET_ENV,
        nccl_conf=NCCL_CONF, tier=profile.name, packages=json.dumps(list(packages)),
        applied=SYSCTL_APPLY_FILE,
    )


def profile_files(cluster, mtu: int | None, nccl: dict[str, str],
                  packages: tuple[str, ...] = PACKAGES) -> dict[str, tuple[str, str]]:
    """{path: (content, mode)}: every file the node profile puts on a node, however it gets there."""
    profile = cluster_profile(cluster)
    return {
        SYSCTL_FILE: (sysctl_conf(profile), "0644"),
        MODULES_FILE: ("tcp_bbr\nsch_fq\n", "0644"),
        NCCL_CONF: (nccl_conf(nccl), "0644"),
        NET_SCRIPT: (net_script(cluster.node_network, mtu), "0755"),
        UNIT_FILE: (UNIT_TEXT, "0644"),
        READY_SCRIPT: (ready_script(profile, packages), "0755"),
    }


def profile_plan(cluster, mtu: int | None, nccl: dict[str, str], packages: bool = True) -> dict:
    """The node profile for the SSH applier (`fatpipe.node.applier`): the same files, sysctls and
    packages cloud-init gets, and what to run. `private_ip` is filled in per host."""
    installs = PACKAGES if packages else ()
    files = profile_files(cluster, mtu, nccl, installs)
    return {
        "files": {path: {"content": content, "mode": mode} for path, (content, mode) in files.items()},
        "sysctls": cluster_profile(cluster).sysctls,
        "packages": list(installs),
        "unit": UNIT, "net_script": NET_SCRIPT, "ready_script": READY_SCRIPT,
        # The host firewall (node/hostfirewall.py); None where the cluster opts out.
        "firewall": firewall_plan(cluster),
    }


def cloud_config(cluster, mtu: int, nccl: dict[str, str]) -> dict:
    """The cloud-config document (a dict) for every node of `cluster`: its private NIC at `mtu`,
    NCCL's settings `nccl`. The node venv is not built here: launch builds it (ops.env.venvs),
    so nothing that changes with the project reaches the user data."""
    files = profile_files(cluster, mtu, nccl)
    return {
        "package_update": True,
        "packages": list(PACKAGES),
        "write_files": [{"path": path, "content": content, "permissions": mode, "owner": "root:root"}
                        for path, (content, mode) in files.items()],
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
    nccl = cluster_profile(cluster).nccl if nccl is None else nccl
    text = "#cloud-config\n" + json.dumps(cloud_config(cluster, mtu, nccl), indent=1) + "\n"
    if len(text.encode()) > limit:
        raise FatpipeError(f"user data for {cluster.name} is {len(text.encode())} bytes; "
                           f"{cluster.provider} allows {limit}")
    return text
