"""bench/stage.py's verdicts and table: each goal of the data side, met or missed, with its figures."""

from __future__ import annotations

MIB = 1 << 20


def goals(rows: list[dict], uplink_mbit: float, link_gbit: float) -> list[str]:
    """Each goal of the issue, met or not, with the figures it was judged on."""
    out = []
    for size in sorted({r["size_mib"] for r in rows}):
        by_n = {r["nodes"]: r for r in rows if r["size_mib"] == size}
        bits = size * MIB * 8
        ideal = bits / (uplink_mbit * 1e6) + bits / (link_gbit * 1e9)
        for n, r in sorted(by_n.items()):
            ratio = r["push_s"] / ideal
            out.append(f"{size} MiB, {n} nodes: push {r['push_s']:.1f} s = {ratio:.2f} x (D/uplink + D/link = "
                       f"{ideal:.1f} s) <= 1.25: {verdict(ratio <= 1.25, size >= 256)}")
        lo, hi = min(by_n), max(by_n)
        if hi != lo:
            ratio = by_n[hi]["push_s"] / by_n[lo]["push_s"]
            out.append(f"{size} MiB: {hi} nodes / {lo} nodes = {ratio:.2f} <= 1.15: {verdict(ratio <= 1.15)}")
            speedup = by_n[hi]["star_s"] / by_n[hi]["push_s"]
            if speedup != speedup:  # NaN: the star was not run (--no-star)
                continue
            out.append(f"{size} MiB, {hi} nodes: star {by_n[hi]['star_s']:.1f} s / chain {by_n[hi]['push_s']:.1f} s "
                       f"= {speedup:.2f}x >= 3: {verdict(speedup >= 3, size >= 1024 and hi >= 8)}")
    for r in (r for r in rows if r["nodes"] == max(x["nodes"] for x in rows)):  # status asks every node
        ratio = r["repush_s"] / r["status_s"]
        out.append(f"{r['size_mib']} MiB, {r['nodes']} nodes: second push {r['repush_s']:.1f} s, "
                   f"{r['repush_ssh_per_node']:g} ssh/node vs status {r['status_s']:.1f} s, "
                   f"{r['status_ssh_per_node']:g} ssh/node: {ratio:.2f}x <= 2 and 1 round trip/node: "
                   f"{verdict(ratio <= 2 and r['repush_ssh_per_node'] == 1)}")
    peak = max(r["peak_process_hwm_mb"] for r in rows)
    out.append(f"a node's staging memory (the largest process, VmHWM): {peak:.0f} MB < 64 MB: {verdict(peak < 64)}")
    return out


def verdict(met: bool, in_scope: bool = True) -> str:
    return ("met" if met else "MISSED") + ("" if in_scope else " (below the goal's size: shown, not judged)")


def table(rows: list[dict], uplink_mbit: float, link_gbit: float) -> str:
    """The figures side by side, one row per case."""
    head = ("| D MiB | N | push s | ideal s | push/ideal | star s | star/push | again s | ssh/node | status s "
            "| again/status | node MB |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        bits = r["size_mib"] * MIB * 8
        ideal = bits / (uplink_mbit * 1e6) + bits / (link_gbit * 1e9)
        lines.append(f"| {r['size_mib']} | {r['nodes']} | {r['push_s']:.1f} | {ideal:.1f} | {r['push_s'] / ideal:.2f} "
                     f"| {r['star_s']:.1f} | {r['star_s'] / r['push_s']:.2f} | {r['repush_s']:.1f} "
                     f"| {r['repush_ssh_per_node']:g} | {r['status_s']:.1f} | {r['repush_s'] / r['status_s']:.2f} "
                     f"| {r['peak_process_hwm_mb']:.0f} |")
    return "\n".join(lines)
