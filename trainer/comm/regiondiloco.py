"""DiLoCo between regions: each region a replica of the model, DDP with its per-step hook inside it,
and DiLoCo's outer step between regions every H steps on int8 pseudo-gradients (docs/ARCHITECTURE.md,
"Regions"). The outer step is `periodic.DiLoCo`'s; only the mean of the pseudo-gradient differs.

Inside a region every rank holds the same parameters (DDP), so the region's pseudo-gradient is
one tensor its ranks share: each exchanges a shard of it with the same-numbered rank of every
other region (`regions.CrossExchange`), as int8 with a scale per chunk and error feedback, and
the region's ranks then put the shards together over the fast links.

comm=auto picks H the way it picks it for DiLoCo over one link (`costmodel.predict_periodic`):
the smallest interval whose exchange, measured between the regions now, stays within the loss
budget's share of the step, at least MIN_AUTO_SYNC_EVERY.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist

from ..bandwidth import bus_factor
from .costmodel import MIN_AUTO_SYNC_EVERY, int8_wire_bytes, predict_periodic
from .decision import LinkEstimate
from .hooks import StepComm
from .periodic import DiLoCo
from .regions import CrossExchange, RegionLayout

log = logging.getLogger(__name__)

_PROBE_BYTES = 256 << 10  # a quarter second at 8 Mbit/s: setup stays short on a slow WAN
_PROBE_SMALL = 1 << 10


class RegionDiLoCo(DiLoCo):
    skips_step_sync = False  # DDP syncs every step inside each region

    def __init__(self, *args, layout: RegionLayout, start_step: int = 0):
        super().__init__(*args, start_step=start_step)
        self.exchange = CrossExchange(layout, self.device)
        self.outer_decision: dict = {}  # how H was chosen: kept in checkpoints, so a resume keeps it

    def _mean(self, flat: torch.Tensor) -> torch.Tensor:
        return self.exchange.mean(flat)

    def after_step(self, step: int) -> None:
        sent, dropped = self.exchange.sent_bytes, self.exchange.dropped_chunks
        super().after_step(step)
        if self.exchange.dropped_chunks > dropped and dist.get_rank() == 0:
            log.warning("step %d: %d chunk(s) of the exchange between regions held a value that "
                        "is not finite: the outer step skipped them on every region",
                        step, self.exchange.dropped_chunks - dropped)
        if self.due(step):  # what crossed, int8 and scales, not the float32 parameters' bytes
            took = self._comm.sync_s
            crossed = self.exchange.sent_bytes - sent
            self._comm = StepComm(took, took, self.param_bytes, crossed, 1)
        else:
            self._comm = StepComm()

    def end_step(self, inner: StepComm | None = None) -> StepComm:
        """The step's inner (per-step hook) and outer (this sync) costs together."""
        outer, inner = self._comm, inner or StepComm()
        return StepComm(inner.sync_s + outer.sync_s, inner.exposed_s + outer.exposed_s,
                        inner.grad_bytes, inner.wire_bytes + outer.wire_bytes,
                        inner.buckets + outer.buckets)

    def summary(self) -> dict:
        """summary.json's `regions`: the groups, the level between them, what rank 0 sent across,
        and the int8 chunks dropped as not finite (the outer step skipped them everywhere)."""
        layout = self.exchange.layout
        return {"regions": layout.regions, "shards": layout.shards,
                "streams": len(layout.cross_groups), "outer": self.outer_decision,
                "rank0_sent_bytes": self.exchange.sent_bytes,
                "nonfinite_chunks_dropped": self.exchange.dropped_chunks}

    def shared_state(self) -> dict:
        return {**super().shared_state(), "outer_decision": self.outer_decision,
                "nonfinite_chunks_dropped": self.exchange.dropped_chunks}

    def rank_state(self) -> dict:
        return {**super().rank_state(), "feedback": self.exchange.feedback.state_dict()}

    def restore(self, shared: dict | None, mine: dict | None) -> None:
        super().restore(shared, mine)
        self.exchange.dropped_chunks = int((shared or {}).get("nonfinite_chunks_dropped", 0))
        if mine and mine.get("feedback"):
            self.exchange.feedback.load_state_dict(mine["feedback"], self.device)


def probe_cross(layout: RegionLayout, device: torch.device) -> LinkEstimate:
    """Collective over the world: the rate and latency between regions as the exchange sees them
    (every shard's ranks all-gathering at once, sharing the link), the slowest on every rank."""
    numbers = torch.zeros(2, dtype=torch.float64, device=device)
    if layout.shard is not None:
        group, peers = layout.cross_groups[0], layout.count
        small, large = (_timed_gather(group, size, peers, device) for size in (_PROBE_SMALL, _PROBE_BYTES))
        # All shards move at once: a region's whole pseudo-gradient moves shards x as fast as
        # one shard does, and predict_periodic divides by bus_factor again.
        gbps = bus_factor(peers) * _PROBE_BYTES * layout.shards * 8 / max(large - small, 1e-6) / 1e9
        numbers[0] = -gbps  # negated: max() finds the slowest
        numbers[1] = small
    dist.all_reduce(numbers, op=dist.ReduceOp.MAX)
    return LinkEstimate(-numbers[0].item(), numbers[1].item(), "probe between regions")


def _timed_gather(group, size: int, peers: int, device: torch.device, iters: int = 3) -> float:
    mine = torch.zeros(size, dtype=torch.int8, device=device)
    every = [torch.empty_like(mine) for _ in range(peers)]
    dist.all_gather(every, mine, group=group)  # warm-up
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_gather(every, mine, group=group)
    return (time.perf_counter() - start) / iters


def decide_outer(layout: RegionLayout, compute_s: float, params: int, cfg, device: torch.device,
                 budget: float) -> dict:
    """comm=auto's level between regions: H and the predicted share of the exchange, from the
    link measured now. The bytes are one region's int8 pseudo-gradient, split over its shards."""
    link = probe_cross(layout, device)
    crossing = int8_wire_bytes(params)
    predicted = predict_periodic(link, compute_s, crossing, layout.count, budget,
                                 steps_left=cfg.steps, min_every=MIN_AUTO_SYNC_EVERY)["diloco"]
    return {"method": "diloco", "quantized": "int8", "link_gbps": link.busbw_gbps,
            "latency_s": link.latency_s, "crossing_bytes": crossing, **predicted}
