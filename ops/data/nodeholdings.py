"""What a node holds that a replace would lose, as this machine knows it: one line per node change.

Read from the local records alone (the run folders under `.fatpipe/<cluster>/runs/` and the data
manifest `fatpipe data push` wrote), never by asking the node: a deploy's question must not hang
on a node that does not answer. docs/ARCHITECTURE.md, "The deploy plan".
"""

from __future__ import annotations

from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.runinfo import list_runs

from ..reach.cluster import Cluster
from .check import read_local_manifest


def held_here(cluster: Cluster) -> str:
    """The runs and staged data this machine knows the cluster's nodes hold; "unknown" when none."""
    parts = []
    runs = [r for r in list_runs(cluster.project, cluster.name, size=False) if r.kind != "empty"]
    if runs:
        newest = runs[-1]
        step = f", step {newest.last_step}" if newest.last_step is not None else ""
        parts.append(f"{len(runs)} run folder(s) (newest {newest.id}{step}; checkpoints and outputs on the nodes)")
    try:
        manifest = read_local_manifest(cluster)
    except FatpipeError:
        manifest = None  # unreadable: say nothing rather than guess
    if isinstance(manifest, dict) and isinstance(manifest.get("total_bytes"), int):
        parts.append(f"staged data {manifest.get('path')} ({manifest['total_bytes'] / 1e9:.2f} GB)")
    return ", ".join(parts) if parts else "unknown (no run or data push recorded here)"


def change_lines(cluster: Cluster, changes) -> list[str]:
    """One line per node change (stacks.nodeplan.NodeChange): the node, the change, its cause, what it holds."""
    held = held_here(cluster)
    return [f"{c.node}: {c.describe()}; holds: {held}" for c in changes]
