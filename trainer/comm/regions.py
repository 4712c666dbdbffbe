"""The process groups of a run across regions, and the exchange between regions (docs/ARCHITECTURE.md,
"Regions").

Each rank's region comes from its node's environment (FATPIPE_REGION, written by the launch from
netcheck's measured grouping or the cluster's declared regions). Every rank learns every other's,
so the groups are built alike everywhere, whatever order torchrun numbered the nodes in:

- one group per region: DDP and its per-step comm hook run inside it, on the fast links;
- across regions, the k-th rank of each region (k below the smallest region's size) forms a
  cross group and exchanges the k-th shard of what crosses: the regions' ranks share the
  exchange, each over its own connections. `streams` groups per shard split it further where
  one flow cannot fill the link (a window-bound or per-flow-capped WAN): each gloo group is
  a connection of its own, and their all-gathers run at once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from fatpipe.node import env as node_env

from ..collectives import all_gather_objects
from .costmodel import int8_wire_bytes
from .quant import ErrorFeedback, dequantize, kept_chunks

MAX_STREAMS = 8


@dataclass
class RegionLayout:
    regions: list[str]  # region names in order of first rank
    region: int  # this rank's region
    region_ranks: list[int]  # the ranks of this rank's region
    region_group: object
    shard: int | None  # which shard this rank exchanges across regions (None: it only receives)
    shards: int
    cross_groups: list  # this rank's `streams` cross groups (empty when shard is None)

    @property
    def count(self) -> int:
        return len(self.regions)


def read_region(env: dict[str, str] | None = None) -> str:
    return (os.environ if env is None else env).get(node_env.REGION, "")


def cross_streams(env: dict[str, str] | None = None) -> int:
    """Parallel connections per shard between regions (the launch's, from netcheck's per-flow rate)."""
    raw = (os.environ if env is None else env).get(node_env.CROSS_STREAMS, "1")
    return max(1, min(MAX_STREAMS, int(raw))) if raw.isdigit() else 1


def region_layout(device: torch.device, label: str, streams: int = 1) -> RegionLayout | None:
    """Collective over the world: the groups, or None when every rank is in one region (or none
    is named). Every rank calls new_group for every group in the same order (torch's rule)."""
    labels = all_gather_objects(label, device)
    if len(set(labels)) < 2 or "" in labels:
        return None
    regions = list(dict.fromkeys(labels))
    members = [[r for r, lab in enumerate(labels) if lab == name] for name in regions]
    mine = regions.index(label)
    rank = dist.get_rank()
    groups = [dist.new_group(ranks) for ranks in members]
    shards = min(len(ranks) for ranks in members)
    position = members[mine].index(rank)
    cross = []
    for k in range(shards):
        made = [dist.new_group([ranks[k] for ranks in members]) for _ in range(streams)]
        if k == position:
            cross = made
    return RegionLayout(regions, mine, members[mine], groups[mine],
                        position if position < shards else None, shards, cross)


def shard_bounds(numel: int, parts: int, index: int) -> tuple[int, int]:
    size = -(-numel // parts)
    return min(numel, index * size), min(numel, (index + 1) * size)


class CrossExchange:
    """The mean over regions of a flat tensor every rank of a region holds alike, sent as int8
    with error feedback; returns it on every rank, and counts what this rank sent across and
    the chunks dropped as not finite (`dropped_chunks`, every shard's: the same on every rank)."""

    def __init__(self, layout: RegionLayout, device: torch.device):
        self.layout, self.device = layout, device
        self.feedback = ErrorFeedback()
        self.sent_bytes = 0
        self.dropped_chunks = 0

    def mean(self, flat: torch.Tensor) -> torch.Tensor:
        layout = self.layout
        # One more value: the chunks this rank's shard dropped, summed with the shards.
        out = torch.zeros(flat.numel() + 1, dtype=flat.dtype, device=flat.device)
        if layout.shard is not None:
            lo, hi = shard_bounds(flat.numel(), layout.shards, layout.shard)
            out[lo:hi], out[-1] = self._exchange(flat[lo:hi])
        # Each shard's owner in the region holds its mean: summing puts every shard everywhere.
        dist.all_reduce(out, group=layout.region_group)
        self.dropped_chunks += int(out[-1].item())
        return out[:-1]

    def _exchange(self, part: torch.Tensor) -> tuple[torch.Tensor, int]:
        q, scales = self.feedback.quantize(part)
        groups = self.layout.cross_groups
        pieces = [shard_bounds(q.numel(), len(groups), s) for s in range(len(groups))]
        gathered, works = [], []
        for group, (lo, hi) in zip(groups, pieces, strict=True):
            qs = [torch.empty(hi - lo, dtype=torch.int8, device=self.device) for _ in range(self.layout.count)]
            works.append(dist.all_gather(qs, q[lo:hi].contiguous(), group=group, async_op=True))
            gathered.append(qs)
        every_scales = [torch.empty_like(scales) for _ in range(self.layout.count)]
        works.append(dist.all_gather(every_scales, scales, group=groups[0], async_op=True))
        for work in works:
            work.wait()
        self.sent_bytes += int8_wire_bytes(q.numel()) * (self.layout.count - 1)
        # A chunk some region could not send counts zero from all: the same outer step everywhere.
        dropped = ~kept_chunks(every_scales)
        self.feedback.drop(dropped)
        total = torch.zeros(part.numel(), device=self.device)
        for region in range(self.layout.count):
            q_region = torch.cat([qs[region] for qs in gathered])
            scales_region = torch.where(dropped, torch.nan, every_scales[region])
            total += dequantize(q_region, scales_region)
        return total / self.layout.count, int(dropped.sum())
