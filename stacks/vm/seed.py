"""What the `vm` seed adds to a cloud's user data (NoCloud vendor data): the wheel disk's mount and
pip's source, a cluster's round trips as netem inside the guest, and a snapshot of the kernel's
own TCP settings (docs/ARCHITECTURE.md, "The vm provider"). The user data wins on any key both
set; the clouds' set no `bootcmd`, which runs early at every boot, so a reboot applies it again."""

from __future__ import annotations

import ipaddress
import json
import math

from fatpipe.infra.tiers import tier_profile

from .wheels import DISK_LABEL, GUEST_PYTHON, MOUNT_POINT, SITE_PACKAGES

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
PIP_ENV = ("PIP_NO_INDEX=1", f"PIP_FIND_LINKS={MOUNT_POINT}/wheels", "PIP_NO_COMPILE=0")
# At every boot, the same lines once: earlier ones of these names go first. The lines are arguments.
PIP_ENV_SCRIPT = ('touch /etc/environment; sed -i "/^PIP_NO_INDEX=/d; /^PIP_FIND_LINKS=/d; /^PIP_NO_COMPILE=/d" '
                  '/etc/environment; printf "%s\\n" "$@" >> /etc/environment')
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
# After them come groups "DELAY IP..." (a delay ends in "ms", an IP never does) or, for a peer
# whose rate is limited (`cross_region_gbps`), "DELAY/RATE/LIMIT IP" (only these hold a "/"):
# each group is the next band, each IP a u32 filter on the packet's source. The root is deleted
# first, so a boot's bootcmd builds the same tree again. A class's minor number is hex to tc.
PEER_RTT_SCRIPT = _RTT_INGRESS + f"""default=$2
shift 2
bands=1
for a in "$@"; do case $a in *ms|*/*) bands=$((bands + 1));; esac; done
tc qdisc del dev {RTT_IFB} root 2>/dev/null || true
tc qdisc add dev {RTT_IFB} root handle 1: prio bands "$bands" priomap 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
tc qdisc add dev {RTT_IFB} parent 1:1 netem delay "$default" limit 100000
band=1
for a in "$@"; do
  case $a in
    *ms) band=$((band + 1))
         tc qdisc add dev {RTT_IFB} parent "$(printf 1:%x "$band")" netem delay "$a" limit 100000;;
    */*) band=$((band + 1)); rest=${{a#*/}}
         tc qdisc add dev {RTT_IFB} parent "$(printf 1:%x "$band")" netem delay "${{a%%/*}}" rate "${{rest%/*}}" limit "${{rest#*/}}";;
    *) tc filter add dev {RTT_IFB} parent 1: protocol ip prio 1 u32 match ip src "$a/32" flowid "$(printf 1:%x "$band")";;
  esac
done
"""  # noqa: E501 - kept byte for byte: changed vendor data would replace deployed VMs
MAX_PEER_DELAYS = 15  # prio has at most 16 bands, band 0 being the default
# A rated band's queue holds a round trip at its rate in 1500-byte packets (half of it is the
# delay line, the rest a router's buffer), at least a NIC's default txqueuelen: a queue of
# seconds, as the default band's 100000 packets would be at a low rate, would bloat the RTT.
MIN_RATED_LIMIT = 1000

# The distribution's values of the tier profile's sysctls and the private NIC's root qdisc, taken
# before the user data's sysctl file exists (bootcmd runs before write_files; on first boot
# only: a later boot would read the profile) so that bench/tuning.py can compare against them.
KERNEL_SYSCTLS = "/var/lib/fatpipe/kernel-sysctls.json"
KERNEL_SYSCTLS_SCRIPT = """import json, os, pathlib, subprocess, sys
out, mac, names = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
if out.exists():
    sys.exit(0)
def address(nic):  # a NIC renamed or removed while listed reads as gone (ENOENT, EINVAL)
    try:
        return (nic / "address").read_text().strip()
    except OSError:
        return None
nics = [d.name for d in pathlib.Path("/sys/class/net").iterdir() if address(d) == mac]
if not nics:
    sys.exit(f"fatpipe kernel-sysctls: no NIC with MAC {mac}")
shown = json.loads(subprocess.run(["tc", "-j", "qdisc", "show", "dev", nics[0], "root"], check=True,
                                  capture_output=True, text=True).stdout or "[]")
doc = {"sysctls": {n: " ".join(pathlib.Path("/proc/sys", *n.split(".")).read_text().split()) for n in names},
       "nic": nics[0], "root_qdisc": shown[0]["kind"] if shown else None}
out.parent.mkdir(parents=True, exist_ok=True)
tmp = out.with_suffix(".tmp")
tmp.write_text(json.dumps(doc, indent=1) + "\\n")
os.replace(tmp, out)
"""


def kernel_sysctls_command(mac: str) -> list[str]:
    """The bootcmd entry writing KERNEL_SYSCTLS (if absent); the names and MAC are arguments."""
    return ["python3", "-c", KERNEL_SYSCTLS_SCRIPT, KERNEL_SYSCTLS, mac, *tier_profile("1g").sysctls]


def half_delay(rtt_ms: float) -> str:
    """What one VM delays for a round trip of `rtt_ms` (0 to 1000), as tc reads it."""
    rtt = float(rtt_ms)
    if not 0 <= rtt <= 1000:  # NaN fails too
        raise ValueError(f"a round trip of {rtt_ms!r} ms is not 0 to 1000")
    return f"{rtt / 2:g}ms"


def rated_band(rtt_ms: float, gbps: float) -> str:
    """A rate-limited peer's band as the script reads it: "DELAY/RATE/LIMIT" (half the round trip,
    the rate in kbit/s, the queue in packets), from numbers checked here."""
    rate = float(gbps)
    if not 0.001 <= rate <= 100:  # NaN fails too
        raise ValueError(f"a rate of {gbps!r} Gbit/s is not 0.001 to 100")
    limit = max(MIN_RATED_LIMIT, math.ceil(rate * 1e9 / 8 * float(rtt_ms) / 1000 / 1500))
    return f"{half_delay(rtt_ms)}/{round(rate * 1e6)}kbit/{limit}"


def peer_delay_args(rtt_ms: float, peer_rtt_ms: dict[str, float],
                    peer_gbps: dict[str, float] | None = None) -> list[str]:
    """PEER_RTT_SCRIPT's arguments after the MAC: the default delay, then "DELAY IP..." per
    distinct delay other than the default (in increasing order), then "DELAY/RATE/LIMIT IP" per
    peer in `peer_gbps` (peer IP -> Gbit/s it may send, each its own band: the rate is per pair).
    Every IP, delay and rate is checked here, so only an IPv4 address or numbers reach the script."""
    default = half_delay(rtt_ms)
    rtts = {str(ipaddress.IPv4Address(ip)): rtt for ip, rtt in peer_rtt_ms.items()}
    rated = {str(ipaddress.IPv4Address(ip)): gbps for ip, gbps in (peer_gbps or {}).items()}
    groups: dict[str, list[str]] = {}
    for ip, rtt in sorted(rtts.items(), key=lambda item: (float(item[1]), ipaddress.IPv4Address(item[0]))):
        delay = half_delay(rtt)
        if delay != default and ip not in rated:
            groups.setdefault(delay, []).append(ip)
    bands = [(delay, *ips) for delay, ips in groups.items()]
    bands += [(rated_band(rtts.get(ip, rtt_ms), rated[ip]), ip) for ip in sorted(rated, key=ipaddress.IPv4Address)]
    if len(bands) > MAX_PEER_DELAYS:
        raise ValueError(f"{len(bands)} distinct round trips or rated peers: at most {MAX_PEER_DELAYS}")
    return [default] + [arg for band in bands for arg in band]


def vendor_data(wheels: bool, mac: str, rtt_ms: float, peer_rtt_ms: dict[str, float] | None = None,
                peer_gbps: dict[str, float] | None = None) -> str:
    """The vendor data of one VM: with `wheels`, mount the wheel disk, show its packages to every
    venv and point pip in every SSH session (launch's venv build) at its wheels alone; with
    `rtt_ms`, delay the private NIC's ingress; with `peer_rtt_ms` (peer IP -> round trip), delay
    those peers' packets by their own round trip instead; with `peer_gbps` (peer IP -> Gbit/s),
    limit what each of those peers sends to its rate; always, snapshot the kernel's TCP
    settings on first boot."""
    bootcmd: list[list[str]] = []
    if wheels:
        bootcmd += [
            ["mkdir", "-p", MOUNT_POINT],
            ["sh", "-c", f"mountpoint -q {MOUNT_POINT} || mount -o ro LABEL={DISK_LABEL} {MOUNT_POINT}"],
            ["sh", "-c", 'printf %s "$1" > "$2"', "fatpipe-site", SITECUSTOMIZE_TEXT, SITECUSTOMIZE],
            # The guests reach no index: pip in every SSH session (launch builds the node venv,
            # ops.env.venvs; pam_env reads /etc/environment) takes the disk's wheels alone. pip
            # reads a `no-` option from the environment as the option without it:
            # PIP_NO_COMPILE=0 skips byte-compiling, minutes under emulation.
            ["sh", "-c", PIP_ENV_SCRIPT, "fatpipe-pip", *PIP_ENV],
        ]
    delays = peer_delay_args(rtt_ms, peer_rtt_ms or {}, peer_gbps)
    if len(delays) > 1:
        bootcmd.append(["sh", "-c", PEER_RTT_SCRIPT, "fatpipe-rtt", mac, *delays])
    elif rtt_ms > 0:
        bootcmd.append(["sh", "-c", RTT_SCRIPT, "fatpipe-rtt", mac, delays[0]])
    bootcmd.append(kernel_sysctls_command(mac))
    return "#cloud-config\n" + json.dumps({"bootcmd": bootcmd}, indent=1) + "\n"
