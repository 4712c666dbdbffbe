"""Each node's region for a run across regions, as the trainer reads it (FATPIPE_REGION), and how
many parallel connections carry the exchange between regions (FATPIPE_CROSS_STREAMS)
(docs/ARCHITECTURE.md, "Regions").

The grouping netcheck measured in this run's folder wins over the cluster's declared regions:
it is what the links are. Streams: where netcheck's slowest pair moves less over one flow than
over several (a window-bound long link, a provider's per-flow cap), the exchange splits over as
many connections as fill the link, at most the trainer's MAX_STREAMS.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from fatpipe.infra.defaults import NETCHECK_FILE
from fatpipe.node.env import CROSS_STREAMS, REGION

MAX_STREAMS = 8  # trainer.comm.regions.MAX_STREAMS (the trainer is not imported here)
# One flow below this share of several flows' rate is capped per flow.
FLOW_CAPPED_BELOW = 0.8


def _netcheck(run_dir: Path) -> dict:
    try:
        doc = json.loads((run_dir / NETCHECK_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def regions_from_doc(doc: dict) -> list[list[str]] | None:
    """The measured grouping read back from a netcheck.json document (one group: one region);
    None when the pairs were not measured or the section is not a list of lists of node names."""
    groups = (doc.get("regions") or {}).get("groups") if isinstance(doc, dict) else None
    if not isinstance(groups, list) or not groups or not all(
            isinstance(group, list) and group and all(isinstance(name, str) for name in group) for group in groups):
        return None
    return [list(group) for group in groups]


def node_regions(outputs, run_dir: Path) -> dict[str, str]:
    """{node name: region} when the nodes are in two regions or more, else {}."""
    groups = regions_from_doc(_netcheck(run_dir))
    if groups and len(groups) > 1:
        return {name: f"r{i}" for i, group in enumerate(groups) for name in group}
    declared = {node.name: node.region for node in outputs.nodes if node.region}
    if len(set(declared.values())) > 1 and len(declared) == len(outputs.nodes):
        return declared
    return {}


def flow_rates(doc: dict, regions: dict[str, str]) -> tuple[float, float] | None:
    """(one flow's, several flows' Gbit/s) on the slowest link between regions: from the pairs
    that cross (netcheck --pairs), else the p2p pairs to node 0."""
    crossing = []
    for link in (doc.get("pairs") or {}).get("links") or []:
        rates = link.get("gbps_by_streams") or {}
        if regions.get(link.get("a")) != regions.get(link.get("b")) and "1" in rates and len(rates) > 1:
            crossing.append((rates["1"], max(rates.values())))
    if crossing:
        return min(one for one, _ in crossing), min(many for _, many in crossing)
    p2p = doc.get("p2p") or {}
    single, multi = p2p.get("single_flow_gbps"), p2p.get("multi_flow_gbps")
    if isinstance(single, (int, float)) and isinstance(multi, (int, float)):
        return single, multi
    return None


def cross_streams(run_dir: Path, regions: dict[str, str]) -> int:
    """Connections per shard between regions: the slowest crossing's multi-flow over its one-flow rate."""
    rates = flow_rates(_netcheck(run_dir), regions)
    if not rates or rates[0] <= 0 or rates[0] >= FLOW_CAPPED_BELOW * rates[1]:
        return 1
    return max(1, min(MAX_STREAMS, math.ceil(rates[1] / rates[0])))


def region_env(outputs, run_dir: Path) -> dict[str, dict[str, str]]:
    """{node name: the variables its run gets} for a run across regions, else {}."""
    regions = node_regions(outputs, run_dir)
    if not regions:
        return {}
    streams = str(cross_streams(run_dir, regions))
    return {name: {REGION: region, CROSS_STREAMS: streams}
            for name, region in regions.items()}
