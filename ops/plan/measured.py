"""`fatpipe plan`'s declared clusters: the link their last netcheck measured beats the catalog."""

from __future__ import annotations

import json
from pathlib import Path

from fatpipe.infra.accelerators import OUTSIDE_CATALOG_GPU
from fatpipe.infra.catalog import MachineType, load_catalog, machine_for
from fatpipe.infra.errors import ConfigError
from fatpipe.trainer.comm.decision import LinkEstimate

from ..reach.cluster import Cluster
from .plan import Candidate


def newest_netcheck(cluster: Cluster) -> tuple[dict, Path] | None:
    """The newest run's netcheck.json of a cluster (run ids sort by time), read; None: none."""
    base = cluster.runs_dir
    if not base.is_dir():
        return None
    for run in sorted((p for p in base.iterdir() if p.is_dir()), key=lambda p: p.name, reverse=True):
        path = run / "netcheck.json"
        if path.is_file():
            try:
                return json.loads(path.read_text()), path
            except (OSError, ValueError):
                continue  # a damaged file: an older run may hold a good one
    return None


def measured_candidates(project) -> list[Candidate]:
    """One candidate per declared cluster with a netcheck: its machine, node count and link."""
    found = []
    for name, cluster in project.clusters.items():  # each declared one, as its model: no lookup by name
        read = newest_netcheck(Cluster(project, cluster))
        if read is None:
            continue
        doc, path = read
        try:
            link = LinkEstimate(float(doc["busbw_gbps"]), float(doc.get("latency_s", 0.0)),
                                f"netcheck {path.parent.name}")
            nodes = len(doc["nodes"]) if doc.get("nodes") else cluster.nodes
        except (KeyError, TypeError, ValueError):
            continue
        if nodes < 2 or not link.busbw_gbps > 0:
            continue
        machine, extras = _machine(project, cluster, link.busbw_gbps)
        found.append(Candidate(f"{cluster.provider} ({name})", machine, cluster.tier, nodes,
                               extras, measured=link))
    return found


def _machine(project, cluster, gbps: float) -> tuple[MachineType, float]:
    """A cloud cluster's catalog type and per-node extras; for others, a node of unknown size
    carrying the seed's GPU, one per GPU it declares (`OUTSIDE_CATALOG_GPU`)."""
    if getattr(cluster, "machine_field", None):
        try:
            catalog = load_catalog(cluster.provider, cluster.region, project.root)
            return machine_for(cluster, project.root), sum(catalog.per_node_extras.values())
        except ConfigError:
            pass
    return MachineType(f"{cluster.name} nodes", gbps, gbps, 0, 0.0, gpus=max(cluster.gpus_per_node, 1),
                       gpu_kind=OUTSIDE_CATALOG_GPU), 0.0
