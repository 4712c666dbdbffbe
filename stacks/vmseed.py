"""What the `vm` seed adds to a cloud's user data (NoCloud vendor data): the wheel disk's mount and
pip's source, and a cluster's round trip as netem inside the guest (docs/ARCHITECTURE.md, "The vm
provider"). The user data wins on any key both set; the clouds' set no `bootcmd`, which runs
early at every boot, so a reboot applies both again."""

from __future__ import annotations

import ipaddress
import json

from .vmwheels import DISK_LABEL, GUEST_PYTHON, MOUNT_POINT, SITE_PACKAGES

# Debian's python imports sitecustomize (this file, through a link from the stdlib folder) in a
# venv too: every venv then sees the wheel disk's packages after its own, so pip counts torch as
# installed and `import torch` reads it from the disk. The system interpreter is left alone.
SITECUSTOMIZE = f"/etc/python{GUEST_PYTHON}/sitecustomize.py"
SITECUSTOMIZE_TEXT = f"""\
# fatpipe vm: venvs see the wheel disk's packages after their own (written at every boot).
import sys
if sys.prefix != sys.base_prefix and {SITE_PACKAGES!r} not in sys.path:
    sys.path.append({SITE_PACKAGES!r})
"""
RTT_IFB = "fprtt0"
# Delay on the private NIC's ingress (redirected to an ifb, netem there): the root qdisc stays
# the profile's fq, which paces what the VM sends and which `wait` checks. Half the round trip
# per VM: every packet between two VMs is delayed once on each way. The MAC and the delay come
# as arguments ($1, $2), never as shell text.
_RTT_INGRESS = f"""set -e
nic=
for d in /sys/class/net/*; do [ "$(cat "$d/address")" = "$1" ] && nic=${{d##*/}}; done
[ -n "$nic" ] || {{ echo "fatpipe rtt: no NIC with MAC $1" >&2; exit 1; }}
ip link show {RTT_IFB} >/dev/null 2>&1 || ip link add {RTT_IFB} type ifb
ip link set {RTT_IFB} mtu "$(cat /sys/class/net/$nic/mtu)" up
tc qdisc replace dev "$nic" handle ffff: ingress
tc filter replace dev "$nic" parent ffff: protocol all prio 1 matchall action mirred egress redirect dev {RTT_IFB}
"""
RTT_SCRIPT = _RTT_INGRESS + f"""tc qdisc replace dev {RTT_IFB} root netem delay "$2" limit 100000
"""
# Per-pair delays (`regions`): the ifb's root is a prio qdisc whose every band holds a netem;
# band 0 (all that no filter picks: the default round trip, this machine's SSH, ARP) gets $2.
# After them come groups "DELAY IP..." (a delay ends in "ms", an IP never does): each group is
# the next band, each IP a u32 filter on the packet's source. The root is deleted first, so a
# boot's bootcmd builds the same tree again. A class's minor number is hex to tc.
PEER_RTT_SCRIPT = _RTT_INGRESS + f"""default=$2
shift 2
bands=1
for a in "$@"; do case $a in *ms) bands=$((bands + 1));; esac; done
tc qdisc del dev {RTT_IFB} root 2>/dev/null || true
tc qdisc add dev {RTT_IFB} root handle 1: prio bands "$bands" priomap 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
tc qdisc add dev {RTT_IFB} parent 1:1 netem delay "$default" limit 100000
band=1
for a in "$@"; do
  case $a in
    *ms) band=$((band + 1))
         tc qdisc add dev {RTT_IFB} parent "$(printf 1:%x "$band")" netem delay "$a" limit 100000;;
    *) tc filter add dev {RTT_IFB} parent 1: protocol ip prio 1 u32 match ip src "$a/32" flowid "$(printf 1:%x "$band")";;
  esac
done
"""
MAX_PEER_DELAYS = 15  # prio has at most 16 bands, band 0 being the default


def half_delay(rtt_ms: float) -> str:
    """What one VM delays for a round trip of `rtt_ms` (0 to 1000), as tc reads it."""
    rtt = float(rtt_ms)
    if not 0 <= rtt <= 1000:  # NaN fails too
        raise ValueError(f"a round trip of {rtt_ms!r} ms is not 0 to 1000")
    return f"{rtt / 2:g}ms"


def peer_delay_args(rtt_ms: float, peer_rtt_ms: dict[str, float]) -> list[str]:
    """PEER_RTT_SCRIPT's arguments after the MAC: the default delay, then "DELAY IP..." per
    distinct delay other than the default (in increasing order). Every IP and delay is checked
    here, so only an IPv4 address or a number reaches the script."""
    default = half_delay(rtt_ms)
    groups: dict[str, list[str]] = {}
    for ip, rtt in sorted(peer_rtt_ms.items(), key=lambda item: (float(item[1]), ipaddress.IPv4Address(item[0]))):
        delay = half_delay(rtt)
        if delay != default:
            groups.setdefault(delay, []).append(str(ipaddress.IPv4Address(ip)))
    if len(groups) > MAX_PEER_DELAYS:
        raise ValueError(f"{len(groups)} distinct round trips to peers: at most {MAX_PEER_DELAYS}")
    return [default] + [arg for delay, ips in groups.items() for arg in (delay, *ips)]


def vendor_data(wheels: bool, mac: str, rtt_ms: float, peer_rtt_ms: dict[str, float] | None = None) -> str:
    """The vendor data of one VM: with `wheels`, mount the wheel disk, show its packages to every
    venv and point every later pip (the boot build's among them) at its wheels alone; with
    `rtt_ms`, delay the private NIC's ingress; with `peer_rtt_ms` (peer IP -> round trip), delay
    those peers' packets by their own round trip instead."""
    bootcmd: list[list[str]] = []
    if wheels:
        bootcmd += [
            ["mkdir", "-p", MOUNT_POINT],
            ["sh", "-c", f"mountpoint -q {MOUNT_POINT} || mount -o ro LABEL={DISK_LABEL} {MOUNT_POINT}"],
            ["sh", "-c", 'printf %s "$1" > "$2"', "fatpipe-site", SITECUSTOMIZE_TEXT, SITECUSTOMIZE],
            # systemd's environment reaches the boot build's transient unit. pip reads a `no-`
            # option from the environment as the option without it: PIP_NO_COMPILE=0 skips
            # byte-compiling, minutes under emulation (the first import compiles what it needs).
            ["systemctl", "set-environment", "PIP_NO_INDEX=1", f"PIP_FIND_LINKS={MOUNT_POINT}/wheels",
             "PIP_NO_COMPILE=0"],
        ]
    delays = peer_delay_args(rtt_ms, peer_rtt_ms or {})
    if len(delays) > 1:
        bootcmd.append(["sh", "-c", PEER_RTT_SCRIPT, "fatpipe-rtt", mac, *delays])
    elif rtt_ms > 0:
        bootcmd.append(["sh", "-c", RTT_SCRIPT, "fatpipe-rtt", mac, delays[0]])
    return "#cloud-config\n" + json.dumps({"bootcmd": bootcmd} if bootcmd else {}, indent=1) + "\n"
