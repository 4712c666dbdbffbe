"""`fatpipe plan --span regions` on a hierarchical run: the same two decisions the trainer makes
across regions (trainer/comm/hiersetup.py), from planned links instead of measured ones.

Inside a region comm=auto's model picks the per-step hook for a ring over the region's nodes
on the in-region link; between regions DiLoCo's interval H comes from `predict_periodic` on the
cross-region link with the int8 pseudo-gradient's bytes, within OUTER_BUDGET of the step. The
predicted step is the region's step plus the exchange's share, as the run's decision line says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fatpipe.trainer.bandwidth import MiB
from fatpipe.trainer.comm.costmodel import (
    MIN_AUTO_SYNC_EVERY,
    OUTER_BUDGET,
    GradTraffic,
    HookCost,
    choose_comm,
    int8_wire_bytes,
    predict_periodic,
)
from fatpipe.trainer.comm.decision import LinkEstimate
from fatpipe.trainer.config import HOOK_NAMES, TrainConfig

_DEFAULTS = TrainConfig()


@dataclass(frozen=True)
class Levels:
    """The plan of a run across regions: each level's method and predicted share, and the step."""

    inner: str
    inner_share: float
    sync_every: int
    outer_share: float
    step_s: float
    usable: bool  # H fits twice in the steps (else DiLoCo would sync once: not periodic training)

    @property
    def method(self) -> str:
        return f"{self.inner} | diloco/{self.sync_every} int8"


def traffic_of(params: int, powersgd_bytes: int, gloo: bool) -> GradTraffic:
    grad_bytes = 4 * params
    return GradTraffic(grad_bytes, max(1, math.ceil(grad_bytes / (_DEFAULTS.bucket_cap_mb * MiB))),
                       powersgd_bytes, powersgd_buckets=1 if gloo else None)


def predict_levels(intra: LinkEstimate, cross: LinkEstimate, compute_s: float, traffic: GradTraffic,
                   nodes: int, regions: int, cost: HookCost) -> Levels:
    """The hierarchical step of `nodes` nodes in `regions` equal regions."""
    per_region = max(1, nodes // regions)
    if per_region > 1:
        inner = choose_comm(intra, compute_s, 1, traffic, per_region, hooks=HOOK_NAMES, cost=cost)
        chosen = inner.predicted[inner.comm]
        name, share, inner_step = inner.comm, chosen["share"], chosen["run_step_s"]
    else:  # one node per region: nothing is sent inside one
        name, share, inner_step = "none", 0.0, compute_s
    params = traffic.grad_bytes // 4
    outer = predict_periodic(cross, inner_step, int8_wire_bytes(params), regions, OUTER_BUDGET,
                             steps_left=cost.steps_left, min_every=MIN_AUTO_SYNC_EVERY)["diloco"]
    step = inner_step + outer["exposed_s"]
    return Levels(name, share, int(outer["sync_every"]), outer["exposed_s"] / step, step, bool(outer["usable"]))


def predict_measured(summary: dict, model, compute_s: float, cross_gbps: float, intra_gbps: float,
                     steps: int, latency_s: float = 2e-3) -> float:
    """What plan predicts for a finished run's method, from its compute and the links' declared
    rates (bench/regions.py compares it with the measured step); `model` is plan's ModelTraffic
    of the run's preset (`plan.model_traffic`)."""
    traffic = traffic_of(model.params, model.powersgd_bytes, gloo=True)
    # The hooks' own seconds per step as the run measured them on these nodes (what plan
    # cannot know from a catalog, but netcheck and the first run tell it for a declared cluster).
    measured = (summary.get("comm_decision") or {}).get("predicted") or {}
    cost = HookCost({name: p.get("hook_s", 0.0) for name, p in measured.items()},
                    {"powersgd": _DEFAULTS.warmup_steps}, steps)
    regions = (summary.get("regions") or {}).get("regions")
    nodes = int(summary.get("world_size") or 4)
    cross = LinkEstimate(cross_gbps, latency_s, "declared")
    if regions:
        intra = LinkEstimate(intra_gbps, latency_s, "declared")
        return predict_levels(intra, cross, compute_s, traffic, nodes, len(regions), cost).step_s
    decision = choose_comm(cross, compute_s, 1, traffic, nodes, hooks=(summary["comm"],), cost=cost)
    return decision.predicted[summary["comm"]]["run_step_s"]
