"""Which node of a run torch made group rank 0: the leader, where rank 0 writes metrics.jsonl,
summary.json, the shared checkpoints, the node metrics and a script's own outputs.

fatpipe's node index (the order of the outputs: node names, `node-<index>.*` files, the
rendezvous host) is not torch's group rank: c10d sorts the nodes by their `--local-addr` string.
Each node records the group rank it got (`node-<index>.group-rank`, trainer.noderank); that
record wins, the rendezvous plan (`nodefiles.planned_group_ranks`) stands in until it exists
(docs/ARCHITECTURE.md, "Rendezvous").
"""

from __future__ import annotations

from pathlib import Path

from fatpipe.infra.defaults import GROUP_RANK_FILE
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.runinfo import recorded_exits

from ..rdzv.nodefiles import planned_group_ranks
from ..rdzv.noderun import NodeRun
from ..rdzv.record import Rendezvous
from ..rdzv.rendezvous import read_rendezvous
from ..reach.cluster import Cluster


def recorded_group_rank(run_dir: Path, index: int) -> int | None:
    """The group rank node `index` recorded, in this machine's copy of the run folder."""
    try:
        text = (Path(run_dir) / GROUP_RANK_FILE.format(index=index)).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def leader_index(rdzv: Rendezvous, run_dir: Path) -> int:
    """The node index of group rank 0: the node that recorded it, else as planned. Under live
    each node is a torchrun world of its own, and node 0 may be the one the run left: the lowest
    node that finished the run (its exit 0 recorded here), node 0 until one has."""
    if rdzv.live:
        exits = recorded_exits(Path(run_dir))
        return min((n.rank for n in rdzv.nodes if exits.get(f"node-{n.rank}") == 0), default=0)
    recorded = [recorded_group_rank(run_dir, n.rank) for n in rdzv.nodes]
    if 0 in recorded:
        return recorded.index(0)
    planned = planned_group_ranks([n.private_ip for n in rdzv.nodes])
    return planned.index(0) if planned else 0


def leader(nodes: list[NodeRun], run_dir: Path) -> NodeRun:
    """The node that runs group rank 0 (`nodes`: a run's nodes in node order, not empty)."""
    index = leader_index(nodes[0].rdzv, run_dir)
    return next((n for n in nodes if n.plan.rank == index), nodes[0])


def leader_first(nodes: list[NodeRun], run_dir: Path) -> list[NodeRun]:
    """`nodes` with the leader first: whom to ask first for what rank 0 wrote."""
    if not nodes:
        return []
    first = leader(nodes, run_dir)
    return [first, *(n for n in nodes if n is not first)]


def latest_leader(cluster: Cluster) -> str | None:
    """The name of the node that ran rank 0 in the cluster's latest run; None without a run."""
    try:
        _, run_dir = cluster.find_run()
        rdzv = read_rendezvous(run_dir)
    except FatpipeError:
        return None
    index = leader_index(rdzv, run_dir)
    return next((n.name for n in rdzv.nodes if n.rank == index), None)
