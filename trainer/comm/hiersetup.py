"""The trainer's setup across regions: the groups, comm=auto per level, and DiLoCo between regions
(docs/ARCHITECTURE.md, "Regions").

Inside a region comm=auto decides the per-step hook as it does on one link, from the region's
own link (probed on its group) and the measured compute; between regions it picks DiLoCo's
interval H from the link measured between them (`regiondiloco.decide_outer`), within
OUTER_BUDGET of the step. The run logs one decision line naming both levels and the predicted
share of each.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from ..config import PERIODIC_NAMES, ConfigError, TrainConfig
from ..distenv import DistEnv
from .allreduce import measure_allreduce
from .commsetup import Measured, candidate_hooks, decide_comm, decide_from, measure_compute
from .costmodel import OUTER_BUDGET
from .decision import CommDecision, LinkEstimate
from .hookcost import measure_hook_costs
from .regiondiloco import RegionDiLoCo, decide_outer
from .regions import RegionLayout, cross_streams, read_region, region_layout

log = logging.getLogger(__name__)

_PROBE_SMALL, _PROBE_LARGE = 4 << 10, 4 << 20


def hierarchical(cfg: TrainConfig) -> bool:
    return cfg.cross_comm == "diloco" or (cfg.cross_comm == "auto" and cfg.auto_periodic)


def open_regions(cfg: TrainConfig, env: DistEnv) -> RegionLayout | None:
    """Collective: the region groups when the run spans regions and syncs hierarchically."""
    if env.world_size == 1 or cfg.cross_comm == "flat":
        return None
    layout = region_layout(env.device, read_region(), cross_streams())
    if layout is None:
        return None
    where = ", ".join(layout.regions)
    if not hierarchical(cfg):
        if env.is_main:
            log.info("regions %s: one ring over every rank (cross_comm auto syncs hierarchically "
                     "with auto_periodic = true, or name cross_comm = \"diloco\")", where)
        return None
    if cfg.comm in PERIODIC_NAMES:
        raise ConfigError(f"--comm {cfg.comm} with --cross-comm diloco: inside a region name a "
                          f"per-step hook (none, bf16, fp16, powersgd) or auto")
    return layout


def probe_region(layout: RegionLayout, grad_bytes: int, device: torch.device) -> LinkEstimate:
    """Collective over the world: each region's link, probed on its own group (slowest region)."""
    size = max(_PROBE_SMALL, min(_PROBE_LARGE, grad_bytes))
    small = measure_allreduce(_PROBE_SMALL, 3, 1, device, layout.region_group)
    large = measure_allreduce(size, 3, 1, device, layout.region_group)
    return LinkEstimate(large.busbw_gbps, small.time_s, f"probe inside each of {layout.count} regions")


def decide_inner(cfg: TrainConfig, env: DistEnv, model: torch.nn.Module, grad_bytes: int,
                 ckpt: dict | None, layout: RegionLayout) -> CommDecision:
    """The per-step hook inside the regions: named, the checkpoint's, or comm=auto's from the
    region's link; its ring is the region's ranks."""
    if cfg.comm != "auto" or (ckpt and ckpt.get("comm_decision")):
        return decide_comm(cfg, env, model, grad_bytes, ckpt)
    region_env = dataclasses.replace(env, world_size=len(layout.region_ranks))
    compute_s = measure_compute(model, cfg, env.device)
    hook_s = measure_hook_costs(model, candidate_hooks(), cfg.powersgd_rank, env.device)
    link = probe_region(layout, grad_bytes, env.device)
    # Periodic methods are the level between regions here, not a choice inside one.
    inner_cfg = dataclasses.replace(cfg, auto_periodic=False)
    return decide_from(inner_cfg, region_env, model, Measured(link, compute_s, hook_s), step=0,
                       hooks=candidate_hooks())


def make_region_diloco(cfg: TrainConfig, env: DistEnv, decision: CommDecision,
                       model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                       layout: RegionLayout, ckpt: dict | None, mine: dict | None) -> RegionDiLoCo:
    """DiLoCo between regions at comm=auto's H (kept from a checkpoint) or --sync-every's, on the
    built-in trainer's model and inner optimizer; `decision` is the hook inside the regions."""
    shared = ckpt.get("periodic") if ckpt else None
    if shared and shared.get("outer_decision"):
        outer = dict(shared["outer_decision"])
    elif cfg.cross_comm == "auto":
        step_s = (decision.chosen or {}).get("step_s") or decision.compute_s
        params = sum(p.numel() for p in model.parameters())
        outer = decide_outer(layout, step_s, params, cfg, env.device, OUTER_BUDGET)
    else:
        outer = {"method": "diloco", "quantized": "int8", "sync_every": cfg.sync_every,
                 "why": "set by --cross-comm diloco (--sync-every)"}
    method = RegionDiLoCo(model, optimizer, int(outer["sync_every"]), cfg.steps, env.device,
                          layout=layout, start_step=ckpt["step"] if ckpt else 0)
    method.outer_decision = outer
    method.restore(shared, mine.get("periodic") if mine else None)
    if env.is_main:
        log.info("%s", describe_levels(layout, decision, outer))
    return method


def describe_levels(layout: RegionLayout, inner: CommDecision, outer: dict) -> str:
    """The decision line of a run across regions: both levels and each one's predicted share."""
    chosen = inner.chosen or {}
    inside = f"{inner.comm}" + (f" ({chosen['share']:.0%} of the step)" if "share" in chosen else "")
    across = f"diloco every {outer['sync_every']} steps, int8 + error feedback"
    if "share" in outer:
        across += (f" ({outer['share']:.1%} of the step; {outer['link_gbps']:.3g} Gbit/s measured, "
                   f"{outer['crossing_bytes'] / 1e6:.2f} MB per sync)")
    return (f"comm across {layout.count} regions ({', '.join(layout.regions)}; {len(layout.region_ranks)} ranks here, "
            f"{layout.shards} shard(s) x {len(layout.cross_groups) or 1} stream(s)): inside each "
            f"region {inside}; between regions {across}")
