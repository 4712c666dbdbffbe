"""Where netbench's ranks run: each rank's node, IP and iperf3, gathered on every rank.

torch and the trainer's collectives are loaded when called (`trainer.lazy`), so netbench stays
importable without torch (`nic` and `p2p` need none).
"""

from __future__ import annotations

import os
import socket

from fatpipe.node.env import NodeEnv

from ..lazy import load
from ..nic import node_ip
from . import p2p
from .sweep import Bench


def describe_ranks(bench: Bench) -> list[dict]:
    """Every rank's node, local rank, IP, name and whether the node has iperf3.

    `node` is the cluster's node index from the launch path's env (FATPIPE_NODE_RANK), else
    torchrun's GROUP_RANK: c10d rendezvous hands out group ranks in arrival order, so they need
    not match the cluster's node order.
    """
    group_rank, node = int(os.environ.get("GROUP_RANK", bench.rank)), NodeEnv.from_environ()
    me = {
        "rank": bench.rank,
        "node": group_rank if node.node_rank is None else node.node_rank,
        "group_rank": group_rank,
        "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
        "ip": node_ip(),
        "name": node.node_name or socket.gethostname(),
        "iperf3": p2p.have_iperf3(),
    }
    return load("fatpipe.trainer.collectives").all_gather_objects(me, bench.device)  # torch: no numpy


def node_leaders(ranks: list[dict]) -> list[dict]:
    """One rank per node (local rank 0), in the cluster's node order."""
    return sorted((r for r in ranks if r["local_rank"] == 0), key=lambda r: r["node"])
