"""The node's environment: what the rendezvous puts in every node's environment for its run, and
how a node reads it back (docs/ARCHITECTURE.md, "The node boundary").

ops.rdzv.rendezvous writes `NodeEnv.to_environ()` (and the variables named below) into each
node's `.env`; the trainer reads `NodeEnv.from_environ()` (its faults, error file, NIC meter,
node metrics, live settings and benchmark). Outside fatpipe (plain torchrun) none is set: each
field is None and the reader falls back on what it can see itself (the hostname, torchrun's
group rank). A value that is there but malformed is named in a ValueError. Standard library
only, Python 3.8: the trainer's package carries this one beside it to the node.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# Every node, every run (NodeEnv).
CLUSTER = "FATPIPE_CLUSTER"
NODE_NAME = "FATPIPE_NODE_NAME"
NODE_RANK = "FATPIPE_NODE_RANK"  # the node's index in the cluster file, not torchrun's group rank
PRIVATE_IP = "FATPIPE_PRIVATE_IP"
TIER_GBPS = "FATPIPE_TIER_GBPS"  # the cluster's declared link rate
# A live run's (trainer.live.manager).
LIVE_LIGHTHOUSE = "FATPIPE_LIVE_LIGHTHOUSE"  # host:port of the run's Lighthouse
LIVE_MIN_REPLICAS = "FATPIPE_LIVE_MIN_REPLICAS"  # replica groups a quorum needs
LIVE_PORT = "FATPIPE_LIVE_PORT"  # the replica group's manager server port (0: any)
NODES = "FATPIPE_NODES"  # the cluster's node count
# A run across regions (trainer.comm.regions).
REGION = "FATPIPE_REGION"
CROSS_STREAMS = "FATPIPE_CROSS_STREAMS"  # parallel connections between regions
# A user's script (trainer.api) and the node's run script (ops.rdzv.nodefiles).
RUN_DIR = "FATPIPE_RUN_DIR"  # the run folder, relative to the project folder on the node
TRAIN_ARGS = "FATPIPE_TRAIN_ARGS"  # the run's [train] settings, as the trainer's flags
GROUP_RANK_FILE = "FATPIPE_GROUP_RANK_FILE"  # where the node records torchrun's group rank
DATA = "FATPIPE_DATA"  # the staged dataset's folder


@dataclass(frozen=True)
class NodeEnv:
    """Who and where the node is in its run; None: not set (a run outside fatpipe)."""

    cluster: str | None = None
    node_name: str | None = None
    node_rank: int | None = None
    private_ip: str | None = None
    tier_gbps: float | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> NodeEnv:
        env = os.environ if environ is None else environ
        return cls(cluster=env.get(CLUSTER) or None, node_name=env.get(NODE_NAME) or None,
                   node_rank=_number(env, NODE_RANK, int), private_ip=env.get(PRIVATE_IP) or None,
                   tier_gbps=_number(env, TIER_GBPS, float))

    def to_environ(self) -> dict[str, str]:
        """The variables of the fields that are set, as a node's environment holds them."""
        values = {CLUSTER: self.cluster, NODE_NAME: self.node_name,
                  NODE_RANK: None if self.node_rank is None else str(self.node_rank),
                  PRIVATE_IP: self.private_ip,
                  TIER_GBPS: None if self.tier_gbps is None else f"{self.tier_gbps:g}"}
        return {name: value for name, value in values.items() if value is not None}


def _number(env: Mapping[str, str], name: str, kind):
    text = env.get(name)
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None
