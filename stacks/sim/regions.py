"""A sim cluster across regions: one bridge per region, joined through a WAN bridge by one shaped
uplink per region (docs/ARCHITECTURE.md, "Regions").

Every flow between two regions leaves its region through that region's uplink and enters the
other's through its uplink, so they all share the cross-region rate as they share a WAN. Both
ends of an uplink are shaped (htb: the link's rate). With a per-flow cap (a provider's limit
on one flow between regions, a window-bound long link) each flow gets an htb class of its own
under the link's, chosen by a u32 hash of the flow's ports: this host's kernel has no fq, whose
`maxrate` would otherwise cap each flow. The hash folds bits 1-5 of each port (connect() picks
even ephemeral ports) into 32 classes; two flows that collide share one flow's rate.

The uplink's host end counts what crosses: its tx bytes left the region, its rx bytes entered it.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from fatpipe.infra.errors import FatpipeError

from .links import bridge_lock, bridge_ports, ensure_bridge, link_exists, run

FLOW_CLASSES = 32
_PORT_BITS = 0x3E  # bits 1-5 of a port


def region_link_names(digest: str, region: int) -> dict[str, str]:
    """The region's bridge (region 0 keeps the one-region name), its uplink's two ends, the WAN."""
    return {
        "bridge": f"fpbr-{digest}" if region == 0 else f"fpbr-{digest}-{region}",
        "uplink": f"fpu{digest}-{region}",  # on the region's bridge
        "wan_end": f"fpw{digest}-{region}",  # on the WAN bridge
        "wan": f"fpwan-{digest}",
    }


def shaping_batch(dev: str, gbit: float, flow_gbit: float | None) -> str:
    """`tc -batch` lines that shape `dev`'s bare egress to `gbit`, each flow to `flow_gbit` if given."""
    rate = f"{int(gbit * 1e9)}bit"
    lines = [f"qdisc add dev {dev} root handle 1: htb default 1 r2q 1000",
             f"class add dev {dev} parent 1: classid 1:1 htb rate {rate} ceil {rate}"]
    if flow_gbit:
        flow = f"{int(flow_gbit * 1e9)}bit"
        lines += [f"class add dev {dev} parent 1:1 classid 1:{0x100 + k:x} htb rate {flow} ceil {flow}"
                  for k in range(FLOW_CLASSES)]
        # Source port picks a table, destination port an entry in it: class = the two XORed, so
        # flows that differ in either port spread over the classes.
        lines.append(f"filter add dev {dev} parent 1: prio 1 handle 100: protocol ip u32 divisor {FLOW_CLASSES}")
        for i in range(FLOW_CLASSES):
            table = f"{0x200 + i:x}"
            lines.append(f"filter add dev {dev} parent 1: prio 1 handle {table}: protocol ip u32 "
                         f"divisor {FLOW_CLASSES}")
            lines += [f"filter add dev {dev} parent 1: prio 1 protocol ip u32 ht {table}:{j:x}: match u32 0 0 "
                      f"flowid 1:{0x100 + (i ^ j):x}" for j in range(FLOW_CLASSES)]
            lines.append(f"filter add dev {dev} parent 1: prio 1 protocol ip u32 ht 100:{i:x}: match u32 0 0 "
                         f"hashkey mask 0x{_PORT_BITS:08x} at 20 link {table}:")
        # TCP and UDP only (ports at byte 20 of an option-less IPv4 header); the rest takes 1:1.
        for proto in (6, 17):
            lines.append(f"filter add dev {dev} parent 1: prio 1 protocol ip u32 ht 800:: "
                         f"match ip protocol {proto} 0xff "
                         f"hashkey mask 0x{_PORT_BITS << 16:08x} at 20 link 100:")
    return "\n".join(lines) + "\n"


def shape_uplink(names: dict[str, str], gbit: float, flow_gbit: float | None) -> None:
    """Shape both ends of the region's uplink (each end's egress is one direction), replacing
    what shaped them (htb cannot be changed in place)."""
    for end in ("uplink", "wan_end"):
        run(["tc", "qdisc", "del", "dev", names[end], "root"], check=False)
    batch = "".join(shaping_batch(names[end], gbit, flow_gbit) for end in ("uplink", "wan_end"))
    proc = subprocess.run(["tc", "-batch", "-"], input=batch, capture_output=True, text=True,
                          start_new_session=True)
    if proc.returncode != 0:
        raise FatpipeError(f"shaping the cross-region link {names['uplink']} failed: {proc.stderr.strip()}")


def uplink_up(names: dict[str, str], gbit: float, flow_gbit: float | None) -> None:
    """The WAN bridge and this region's uplink to it, (re)shaped; with the region bridge's lock held."""
    with bridge_lock(names["wan"]):
        ensure_bridge(names["wan"])
        if not link_exists(names["uplink"]):
            run(["ip", "link", "add", names["uplink"], "type", "veth", "peer", "name", names["wan_end"]])
            run(["ip", "link", "set", names["wan_end"], "master", names["wan"], "up"])
            run(["ip", "link", "set", names["uplink"], "master", names["bridge"], "up"])
    # Again on every node: a cluster redeclared with another rate replaces its nodes, not the link.
    shape_uplink(names, gbit, flow_gbit)


def uplink_down(names: dict[str, str]) -> None:
    """Remove the region's uplink and bridge once no node is on it, the WAN once no region is;
    with the region bridge's lock held."""
    if link_exists(names["bridge"]) and set(bridge_ports(names["bridge"])) <= {names["uplink"]}:
        run(["ip", "link", "del", names["uplink"]], check=False)  # takes its WAN end with it
        run(["ip", "link", "del", names["bridge"]], check=False)
    with bridge_lock(names["wan"]):
        if link_exists(names["wan"]) and not bridge_ports(names["wan"]):
            run(["ip", "link", "del", names["wan"]], check=False)


def sweep_bridges(digest: str) -> list[str]:
    """Remove a cluster's bridges that no node is on: one region's, or every region's with its
    uplink, and the WAN. Returns the bridges removed."""
    uplinks = [name for name in os.listdir("/sys/class/net") if re.fullmatch(rf"fpu{digest}-\d+", name)]
    regions = sorted(int(name.rsplit("-", 1)[1]) for name in uplinks) or [0]
    removed = []
    for region in regions:
        names = region_link_names(digest, region)
        with bridge_lock(names["bridge"]):
            there = link_exists(names["bridge"])
            if uplinks:
                uplink_down(names)
            elif there and not bridge_ports(names["bridge"]):
                run(["ip", "link", "del", names["bridge"]], check=False)
            if there and not link_exists(names["bridge"]):
                removed.append(names["bridge"])
    return removed


def reshape_cross_region(digest: str, regions: int, gbit: float, flow_gbit: float | None = None) -> None:
    """Set the link between regions of a deployed sim cluster to `gbit` (each flow to
    `flow_gbit`), in place: a rehearsal of another WAN without redeploying."""
    for region in range(regions):
        shape_uplink(region_link_names(digest, region), gbit, flow_gbit)


def crossed_bytes(digest: str, regions: int) -> dict[int, dict[str, int]]:
    """Per region, the bytes its uplink carried out of (`out`) and into (`in`) it so far."""
    counts = {}
    for region in range(regions):
        stats = Path("/sys/class/net", region_link_names(digest, region)["uplink"], "statistics")
        try:
            counts[region] = {"out": int((stats / "tx_bytes").read_text()),
                              "in": int((stats / "rx_bytes").read_text())}
        except OSError:
            continue  # the region is not up
    return counts
