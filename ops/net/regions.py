"""Regions found, not only declared: group a cluster's nodes by the links `netcheck --pairs`
measured, hold the declared grouping against it, and say which pairs cross regions for the gate
(docs/netcheck.md, "Regions"; docs/ARCHITECTURE.md, "Regions"). Pure functions.

The method is single linkage at the largest gap: sort the distinct link rates, find the largest
ratio between two neighbours; when it reaches REGION_GAP, the links above it join nodes into groups
(connected components). A group stands only when every link inside it is REGION_GAP times every
link out of it; else there is no clear grouping, and the cluster counts as one region.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Nodes joined by links at least this many times faster than the links between their groups are
# one region. Inside a data center links run at 1-25 Gbit/s; a WAN's share between regions is
# typically 10x less, and the sim and vm rehearse 10 vs 1 or 0.2 Gbit/s. Run-to-run noise is a few
# percent, so 3x separates the two with room on both sides.
REGION_GAP = 3.0
UNDECLARED = "?"  # the label of nodes naming no region on a cluster where others name one


@dataclass(frozen=True)
class Grouping:
    """The measured regions: node names in node order, groups in the order of their first node."""

    groups: list[list[str]]
    intra_gbps: float | None = None  # the slowest link inside a group
    cross_gbps: float | None = None  # the fastest link between groups
    why_one: str | None = None  # one region: why ("every link within 1.4x", "no clear grouping: ...")
    decisive: bool = True  # False: too few nodes or pairs measured to tell regions apart

    @property
    def ratio(self) -> float | None:
        return None if self.intra_gbps is None or not self.cross_gbps else self.intra_gbps / self.cross_gbps


@dataclass(frozen=True)
class CrossRegions:
    """Which node pairs cross regions for the gate, and the declared rate they are held to (None:
    they are reported, not judged)."""

    region_of: dict[str, str]
    gbps: float | None
    source: str  # "declared" (the nodes' regions) or "measured" (the grouping found)

    def crosses(self, a: str, b: str) -> bool:
        return a in self.region_of and b in self.region_of and self.region_of[a] != self.region_of[b]

    @property
    def spans(self) -> bool:
        return len(set(self.region_of.values())) > 1


def _times(fast: float, slow: float) -> float:
    return fast / slow if slow > 0 else math.inf


def _components(count: int, joined: list[tuple[int, int]]) -> list[list[int]]:
    """The connected components of nodes 0..count-1, each in index order, by their first index."""
    parent = list(range(count))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in joined:
        parent[max(root(i), root(j))] = min(root(i), root(j))
    groups: dict[int, list[int]] = {}
    for i in range(count):
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values())


def measured_regions(nodes: list[str], links, gap: float = REGION_GAP) -> Grouping:
    """Group `nodes` by the measured `links` (each with `a`, `b`, `best_gbps`; a link that measured
    no throughput counts as 0 Gbit/s, the slowest there is)."""
    at = {name: i for i, name in enumerate(nodes)}
    rates = {(min(at[link.a], at[link.b]), max(at[link.a], at[link.b])): link.best_gbps
             for link in links if link.a in at and link.b in at and link.a != link.b}
    one = [list(nodes)]
    if len(nodes) < 3 or len(rates) < len(nodes) * (len(nodes) - 1) // 2:
        why = f"{len(nodes)} nodes: too few links to compare" if len(nodes) < 3 else "not every pair was measured"
        return Grouping(one, min(rates.values(), default=None), why_one=why, decisive=False)
    distinct = sorted(set(rates.values()), reverse=True)
    if _times(distinct[0], distinct[-1]) < gap:
        return Grouping(one, distinct[-1], why_one=f"every link within {_times(distinct[0], distinct[-1]):.1f}x")
    widest, floor = max((_times(fast, slow), fast) for fast, slow in zip(distinct, distinct[1:], strict=False))
    if widest < gap:
        return Grouping(one, distinct[-1], why_one=f"no clear grouping: the links spread from {distinct[-1]:.2f} "
                                                   f"to {distinct[0]:.2f} Gbit/s without a {gap:g}x gap")
    members = _components(len(nodes), [pair for pair, rate in rates.items() if rate >= floor])
    if len(members) == 1:
        return Grouping(one, distinct[-1], why_one="the fast links join every node: the slow ones are odd links, "
                                                   "not a region's")
    group_of = {i: g for g, group in enumerate(members) for i in group}
    inside = {pair: rate for pair, rate in rates.items() if group_of[pair[0]] == group_of[pair[1]]}
    for g in range(len(members)):  # every link inside the group >= gap x every link out of it
        within = [(rate, pair) for pair, rate in inside.items() if group_of[pair[0]] == g]
        out = [rate for pair, rate in rates.items()
               if pair not in inside and g in (group_of[pair[0]], group_of[pair[1]])]
        if within and min(within)[0] < gap * max(out):
            slow, (i, j) = min(within)
            return Grouping(one, distinct[-1], why_one=f"no clear grouping: {nodes[i]} <-> {nodes[j]} at {slow:.2f} "
                                                       f"Gbit/s is not {gap:g}x the {max(out):.2f} out of their group")
    cross = max(rate for pair, rate in rates.items() if pair not in inside)
    return Grouping([[nodes[i] for i in group] for group in members], min(inside.values(), default=None), cross)


def declared_regions(outputs) -> dict[str, list[str]] | None:
    """The regions the nodes were declared in, label -> node names (None: no node names one)."""
    if not any(node.region for node in outputs.nodes):
        return None
    declared: dict[str, list[str]] = {}
    for node in outputs.nodes:
        declared.setdefault(node.region or UNDECLARED, []).append(node.name)
    return declared


def named(groups: list[list[str]]) -> dict[str, list[str]]:
    """Measured groups under the names r0, r1..."""
    return {f"r{g}": group for g, group in enumerate(groups)}


def show(regions: dict[str, list[str]]) -> str:
    return " ".join(f"{label}=[{','.join(names)}]" for label, names in regions.items())


def contradictions(declared: dict[str, list[str]] | None, found: Grouping) -> list[str]:
    """One line per way the measurement contradicts the declared regions (none when it agrees,
    nothing was declared, or too little was measured to tell)."""
    if not declared or not found.decisive:
        return []
    if sorted(map(sorted, declared.values())) == sorted(map(sorted, found.groups)):
        return []
    if len(found.groups) == 1:
        return [f"declared regions {show(declared)}, measured one region: {found.why_one}"]
    measured = f"measured {show(named(found.groups))}, links across at most {found.cross_gbps:.2f} Gbit/s"
    if len(declared) == 1:
        return [f"declared one region {show(declared)}, {measured}"]
    label_of = {name: label for label, names in declared.items() for name in names}
    lines = []
    for group in found.groups:  # declared apart, measured together: named against the group's main region
        labels = [label_of[name] for name in group]
        main = max(labels, key=lambda label: (labels.count(label), -labels.index(label)))
        lines += [f"{name} declared in {label_of[name]} but its links to {main} are as fast as inside {main}"
                  for name in group if label_of[name] != main]
    group_of = {name: g for g, group in enumerate(found.groups) for name in group}
    for label, names in declared.items():  # declared together, measured apart
        parts = [[name for name in names if group_of[name] == g] for g in sorted({group_of[n] for n in names})]
        if len(parts) > 1:
            lines.append(f"{label} declared as one region but measured apart: "
                         + " and ".join(f"[{','.join(part)}]" for part in parts))
    return lines or [f"declared regions {show(declared)}, {measured}"]


def cross_regions(outputs, found: Grouping | None) -> CrossRegions | None:
    """The regions the gate holds cross-region pairs by: the declared ones where the nodes name
    them; else, on a cluster that declares a cross-region rate, the measured grouping; else none
    (a slow node on a cluster declared in one region is a fault, not a region)."""
    declared = declared_regions(outputs)
    if declared is not None:
        if len(declared) < 2:
            return None
        region_of = {name: label for label, names in declared.items() for name in names}
        return CrossRegions(region_of, outputs.cross_region_gbps, "declared")
    if outputs.cross_region_gbps is None or found is None or len(found.groups) < 2:
        return None
    region_of = {name: label for label, names in named(found.groups).items() for name in names}
    return CrossRegions(region_of, outputs.cross_region_gbps, "measured")


def judge_regions(outputs, links: list | None) -> tuple[dict | None, CrossRegions | None]:
    """netcheck.json's `regions` (None unless the pairs were measured: `links`) and the regions
    the gate holds cross-region pairs by."""
    found = None if links is None else measured_regions([node.name for node in outputs.nodes], links)
    crossing = cross_regions(outputs, found)
    if found is None:
        return None, crossing
    declared = declared_regions(outputs)
    doc = {"k": REGION_GAP, "groups": found.groups, "intra_gbps": found.intra_gbps, "cross_gbps": found.cross_gbps,
           "ratio": found.ratio, "why_one": found.why_one, "declared": declared,
           "declared_cross_gbps": outputs.cross_region_gbps,
           "judged_by": crossing.source if crossing else None, "contradicts": contradictions(declared, found)}
    return doc, crossing


def region_lines(doc: dict) -> list[tuple[str, bool]]:
    """netcheck's printed lines about regions, each with whether it is a warning."""
    regions = doc.get("regions")
    if not regions:
        return []
    if len(regions["groups"]) > 1:
        ratio = f" ({regions['ratio']:.1f}x)" if regions["ratio"] else ""
        intra = "-" if regions["intra_gbps"] is None else f"{regions['intra_gbps']:.2f}"
        head = (f"regions measured: {show(named(regions['groups']))}, links within >= {intra} Gbit/s, "
                f"across <= {regions['cross_gbps']:.2f}{ratio}")
        if regions["declared"] is None:  # no regions declared: the slow side is a fault the gate judges
            head += "; the cluster declares one region, so these are slow links, not regions"
    else:
        head = f"regions measured: one ({regions['why_one']})"
    return [(head, False)] + [(f"warning: {line}", True) for line in regions["contradicts"]]
