"""comm = "auto": pick the least lossy comm hook whose predicted exposed communication fits.

Inputs are measured: the link's all-reduce bus bandwidth and latency (from the run's
netcheck.json, else a short probe now) and the compute time of one step without any
communication. The model of a step is deliberately simple and logged with its numbers:

    comm_s    = all-reduce rounds x latency + wire_bytes x 2(n-1)/n / busbw
    exposed_s = max(comm_s - overlap x backward_s, comm_s / buckets)

DDP can hide communication behind the backward pass of the last micro-batch (about two
thirds of forward + backward), except for the last bucket, which is ready only when backward
ends. A hook qualifies when exposed_s <= 20% of the predicted step (compute_s + exposed_s).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .allreduce import measure_allreduce
from .bandwidth import bus_factor
from .config import HOOK_NAMES

log = logging.getLogger(__name__)

EXPOSED_BUDGET = 0.20  # largest share of a step that communication may leave exposed
BACKWARD_SHARE = 2 / 3  # backward's share of forward + backward compute

_PROBE_LATENCY_BYTES = 4 << 10
_PROBE_BANDWIDTH_BYTES = 16 << 20


@dataclass(frozen=True)
class LinkEstimate:
    busbw_gbps: float
    latency_s: float
    source: str  # "netcheck.json" or "probe"


@dataclass(frozen=True)
class CommDecision:
    comm: str
    reason: str
    link: LinkEstimate | None = None
    compute_s: float = 0.0
    grad_bytes: int = 0
    buckets: int = 1
    world_size: int = 1
    predicted: dict = field(default_factory=dict)  # hook -> wire_bytes, comm_s, exposed_s, share

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        lines = [f"comm=auto chose {self.comm}: {self.reason}"]
        if self.link:
            lines.append(f"  link {self.link.busbw_gbps:.2f} Gbit/s busbw, "
                         f"{self.link.latency_s * 1e3:.2f} ms latency ({self.link.source}); "
                         f"compute {self.compute_s * 1e3:.1f} ms/step; "
                         f"grad {self.grad_bytes / 1e6:.1f} MB in {self.buckets} bucket(s); "
                         f"{self.world_size} ranks")
        for name, p in self.predicted.items():
            lines.append(f"  {name:8s} wire {p['wire_bytes'] / 1e6:8.2f} MB  comm "
                         f"{p['comm_s'] * 1e3:8.1f} ms  exposed {p['exposed_s'] * 1e3:8.1f} ms "
                         f"({p['share']:.0%} of step)")
        return "\n".join(lines)


def read_netcheck(run_dir: Path) -> LinkEstimate | None:
    """The link as measured by `fatpipe netcheck`, if this run directory holds its result."""
    path = run_dir / "netcheck.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return LinkEstimate(float(data["busbw_gbps"]), float(data.get("latency_s", 0.0)),
                            "netcheck.json")
    except (ValueError, KeyError, TypeError) as e:
        log.warning("ignoring %s: %s", path, e)
        return None


def probe_link(device: torch.device, grad_bytes: int) -> LinkEstimate:
    """A short all-reduce probe: a small message for latency, a large one for bandwidth."""
    small = measure_allreduce(_PROBE_LATENCY_BYTES, iters=10, warmup=2, device=device)
    size = max(_PROBE_LATENCY_BYTES, min(_PROBE_BANDWIDTH_BYTES, grad_bytes))
    large = measure_allreduce(size, iters=5, warmup=1, device=device)
    return LinkEstimate(large.busbw_gbps, small.time_s, "probe")


def powersgd_wire_elements(shapes: list[torch.Size], rank: int, min_rate: float = 2.0) -> int:
    """Elements PowerSGD sends per step for these parameter shapes (torch's compress rule)."""
    total = 0
    for shape in shapes:
        n = shape[0] if len(shape) else 1
        m = math.prod(shape[1:]) if len(shape) > 1 else 1
        r = min(n, m, rank)
        compressed = (n + m) * r
        total += compressed if compressed * min_rate < n * m else n * m
    return total


@dataclass(frozen=True)
class GradTraffic:
    """What one step's gradient sync sends: its size, its DDP buckets, and PowerSGD's share."""

    grad_bytes: int
    buckets: int
    powersgd_bytes: int
    powersgd_buckets: int | None = None  # PowerSGD's own bucket count (one bucket on gloo)


def choose_comm(link: LinkEstimate, compute_s: float, grad_accum: int, traffic: GradTraffic,
                world_size: int, hooks: tuple[str, ...] = HOOK_NAMES) -> CommDecision:
    """Apply the model above to each of `hooks` and pick the least lossy one within budget.

    Needs world_size > 1: a single process has nothing to send (the trainer decides that itself).
    """
    grad_bytes, buckets = traffic.grad_bytes, traffic.buckets
    powersgd_bytes, powersgd_buckets = traffic.powersgd_bytes, traffic.powersgd_buckets
    common = dict(link=link, compute_s=compute_s, grad_bytes=grad_bytes, buckets=buckets,
                  world_size=world_size)
    wire = {"none": grad_bytes, "bf16": grad_bytes // 2, "fp16": grad_bytes // 2,
            "powersgd": powersgd_bytes}
    # PowerSGD runs three dependent all-reduces per bucket (uncompressed part, P, then Q).
    rounds = {"none": 1, "bf16": 1, "fp16": 1, "powersgd": 3}
    bytes_per_s = max(link.busbw_gbps, 1e-9) * 1e9 / 8
    hideable = BACKWARD_SHARE * compute_s / grad_accum
    candidates = [name for name in HOOK_NAMES if name in hooks]  # least lossy first
    predicted = {}
    for name in candidates:
        n_buckets = (powersgd_buckets or buckets) if name == "powersgd" else buckets
        comm_s = (rounds[name] * n_buckets * link.latency_s
                  + wire[name] * bus_factor(world_size) / bytes_per_s)
        exposed = max(comm_s - hideable, comm_s / n_buckets)
        predicted[name] = {"wire_bytes": wire[name], "comm_s": comm_s, "exposed_s": exposed,
                           "share": exposed / (compute_s + exposed) if compute_s + exposed else 0}
    for name in candidates:
        if predicted[name]["share"] <= EXPOSED_BUDGET:
            reason = (f"least lossy hook with predicted exposed comm "
                      f"{predicted[name]['share']:.0%} <= {EXPOSED_BUDGET:.0%} of the step")
            return CommDecision(name, reason, predicted=predicted, **common)
    best = min(candidates, key=lambda n: predicted[n]["exposed_s"])
    reason = (f"no hook keeps exposed comm within {EXPOSED_BUDGET:.0%}; "
              f"{best} exposes the least ({predicted[best]['share']:.0%})")
    return CommDecision(best, reason, predicted=predicted, **common)
