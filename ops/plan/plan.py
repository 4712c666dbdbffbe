"""`fatpipe plan`: predict each candidate cluster's step, comm method, hours and dollars.

The candidates are the catalogs' machine types at each tier and node count, each computing
with its own GPUs (`infra.accelerators.node_accelerator`) unless one accelerator is forced on
every node; a type whose GPU has no sourced figure is left out of the ranking and listed
(`unranked`). The job model (`infra.jobmodel`) gives each one's compute and link; a node of G
GPUs is G ranks that sum inside the node first, so the link carries a ring over the nodes. The
trainer's own comm=auto model
(`trainer.comm.costmodel.choose_comm`, the same code the run will use, docs/ARCHITECTURE.md, "Data
flow") picks the method and predicts the step from a synthetic "measured" link: the catalog's
baseline, capped by the flows, at default hook costs (none measured yet: 0 s).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from fatpipe.infra.accelerators import OUTSIDE_CATALOG_GPU, missing_figure, node_accelerator
from fatpipe.infra.catalog import MachineType, load_catalog
from fatpipe.infra.errors import ConfigError
from fatpipe.infra.jobmodel import Accelerator, Job, Link, plan_link, ring_allreduce_bytes
from fatpipe.infra.spec import TIER_GBPS
from fatpipe.trainer.bandwidth import MiB
from fatpipe.trainer.comm.costmodel import (
    GradTraffic,
    HookCost,
    choose_comm,
    powersgd_wire_elements,
)
from fatpipe.trainer.comm.decision import LinkEstimate
from fatpipe.trainer.config import HOOK_NAMES, PERIODIC_NAMES, PRESETS, TrainConfig
from fatpipe.trainer.gptconfig import parameter_shapes, preset_config

from .regionplan import predict_levels

# One hop of a ring step inside a region: in-region round trips are 0.05-2 ms (infra/tiers.py),
# one way about half; a ring all-reduce takes 2 x (N-1) such steps.
HOP_LATENCY_S = 100e-6
PROVIDERS = ("aws", "digitalocean")
# --span regions with auto_periodic: the nodes split into this many regions unless --regions says
# otherwise (the bench's and the sim's two), whose round trip is a continent's (US coast to coast ~ 60-70 ms).
PLANNED_REGIONS = 2
CROSS_REGION_LATENCY_S = 0.07
_DEFAULTS = TrainConfig()  # the trainer's own bucket size, PowerSGD rank and LR warmup


@dataclass(frozen=True)
class ModelTraffic:
    """A model's size and what PowerSGD at the trainer's default rank would send of it."""

    params: int
    powersgd_bytes: int


@lru_cache(maxsize=8)
def _preset_traffic(preset: str) -> ModelTraffic:
    shapes = parameter_shapes(preset_config(preset, block_size=1024))  # the GPT's, without torch
    params = sum(math.prod(shape) for shape in shapes)
    return ModelTraffic(params, powersgd_wire_elements(shapes, _DEFAULTS.powersgd_rank) * 4)


def parse_count(text: str) -> int:
    """A count from `124000000`, `124M`, `1.5B` or `350k`."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMbBgG]?)\s*", str(text))
    if not m:
        raise ConfigError(f"{text!r} is not a count such as 124M, 1.5B or 350000000")
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def model_traffic(model: str) -> ModelTraffic:
    """A trainer preset's exact shapes, or a parameter count shaped like GPT-2 124M (whose
    PowerSGD compression ratio it takes)."""
    if model in PRESETS:
        return _preset_traffic(model)
    params = parse_count(model)
    if params <= 0:
        raise ConfigError(f"--model: {model!r} is not a preset ({', '.join(PRESETS)}) or a parameter count")
    ref = _preset_traffic("124m")
    return ModelTraffic(params, int(params * ref.powersgd_bytes / ref.params))


@dataclass(frozen=True)
class Candidate:
    provider: str
    machine: MachineType
    tier: str
    nodes: int
    extras_hourly: float = 0.0  # per node, besides the machine: public IPv4 and the like
    measured: LinkEstimate | None = None  # a declared cluster's netcheck: beats the catalog
    span: str = "region"  # the ring's traffic: in one region, across regions, over the internet
    regions: int = PLANNED_REGIONS  # span "regions": how many, the nodes split evenly between them


@dataclass(frozen=True)
class Prediction:
    candidate: Candidate
    link: Link
    compute_s: float
    step_s: float  # mean over the job's steps, on the method chosen
    plain_step_s: float  # the same step with plain DDP (comm = "none"): what auto saves
    method: str
    exposed_share: float  # hook + exposed communication over the step
    ring_bytes: float  # per node and step, plain gradients
    hours: float
    dollars: float | None  # None: no price in the catalog
    reason: str
    accel: Accelerator | None = None  # what computes on each node
    per_node: int = 1  # of it on each node: its GPUs (or vCPUs)
    ranks_per_node: int = 1  # trainer processes on each node: one per GPU

    def to_dict(self) -> dict:
        c, link = self.candidate, self.link
        accel = self.accel
        return {
            "provider": c.provider, "machine": c.machine.name, "tier": c.tier, "nodes": c.nodes,
            "accelerator": (accel.kind or accel.name) if accel else None, "per_node": self.per_node,
            "ranks_per_node": self.ranks_per_node,
            "baseline_gbps": link.baseline_gbps, "link_gbps": link.gbps,
            "flow_cap_gbps": link.flow_cap_gbps, "burst_only": link.burst_only,
            "tier_unreachable": link.tier_unreachable, "compute_s": self.compute_s,
            "step_s": self.step_s, "plain_step_s": self.plain_step_s, "method": self.method,
            "exposed_share": self.exposed_share,
            "ring_bytes": self.ring_bytes, "hours": self.hours, "dollars": self.dollars,
            "hourly": _hourly(c), "reason": self.reason,
            "link_source": c.measured.source if c.measured else "catalog baseline", "span": c.span,
        }


def _hourly(c: Candidate) -> float | None:
    if c.machine.price_hourly is None:
        return None
    return (c.machine.price_hourly + c.extras_hourly) * c.nodes


def predict(job: Job, accel: Accelerator | None, traffic: ModelTraffic, cand: Candidate,
            auto_periodic: bool = False) -> Prediction:
    """One candidate's step as comm=auto would run it, and the job's hours and dollars; `accel`
    on every node, or None for the machine's own (ConfigError where it has no sourced figure).

    A node's G GPUs sum their gradients inside it first (`infra.jobmodel.IN_NODE_GBPS`), so the
    link carries a ring over the N nodes: comm=auto's model is fed N, not N x G ranks."""
    n = cand.nodes
    if n < 2:
        raise ConfigError("a plan needs 2 nodes or more: one node sends nothing")
    node = node_accelerator(cand.machine, accel)
    if node is None:
        raise ConfigError(f"{cand.provider} {cand.machine.name}: {missing_figure(cand.machine)}; "
                          "give --accelerator NAME (or --tokens-per-s) to plan it")
    if cand.measured is not None:  # what netcheck measured already holds every cap
        measured = cand.measured
        link = Link(measured.busbw_gbps, measured.busbw_gbps, None, False,
                    measured.busbw_gbps < TIER_GBPS[cand.tier])
    else:
        link = plan_link(cand.provider, cand.machine, node, cand.tier, TIER_GBPS[cand.tier], cand.span)
        measured = LinkEstimate(link.gbps, 2 * (n - 1) * HOP_LATENCY_S, "catalog baseline")
    compute_s = job.compute_s(node, n, cand.machine)
    grad_bytes = 4 * traffic.params
    grads = GradTraffic(grad_bytes, max(1, math.ceil(grad_bytes / (_DEFAULTS.bucket_cap_mb * MiB))),
                        traffic.powersgd_bytes,
                        powersgd_buckets=1 if node.gpus == 0 else None)  # gloo: one bucket
    warmup = _DEFAULTS.warmup_steps if job.warmup_steps is None else job.warmup_steps
    cost = HookCost({}, {"powersgd": max(2, warmup)}, job.steps)
    decision = choose_comm(measured, compute_s, 1, grads, n, hooks=HOOK_NAMES + PERIODIC_NAMES,
                           cost=cost, auto_periodic=auto_periodic)
    chosen = decision.predicted[decision.comm]
    step_s = chosen["run_step_s"]
    method, share, reason = decision.comm, chosen["share"], decision.reason
    regions = cand.regions
    if cand.span == "regions" and auto_periodic and cand.measured is None and n >= regions:
        # The run across regions syncs per level (trainer/comm/hiersetup.py): DDP inside each
        # region on its own link, DiLoCo between them on the cross-region one.
        inside = plan_link(cand.provider, cand.machine, node, cand.tier, TIER_GBPS[cand.tier], "region")
        per_region = max(1, n // regions)
        intra = LinkEstimate(inside.gbps, 2 * max(1, per_region - 1) * HOP_LATENCY_S, "catalog baseline")
        levels = predict_levels(intra, LinkEstimate(link.gbps, CROSS_REGION_LATENCY_S, "catalog"),
                                compute_s, grads, n, regions, cost)
        if levels.usable:
            step_s, method, share = levels.step_s, levels.method, levels.inner_share + levels.outer_share
            reason = (f"{regions} regions of {per_region} node(s): inside each {levels.inner} "
                      f"({levels.inner_share:.0%}), between them DiLoCo every {levels.sync_every} steps "
                      f"on int8 ({levels.outer_share:.1%})")
    hours = job.steps * step_s / 3600
    hourly = _hourly(cand)
    return Prediction(cand, link, compute_s, step_s, decision.predicted["none"]["step_s"],
                      method, share,
                      ring_allreduce_bytes(grad_bytes, n), hours,
                      hours * hourly if hourly is not None else None, reason,
                      node, node.count_on(cand.machine), node.ranks_on(cand.machine))


def candidates(accel: Accelerator | None, nodes: range, providers=PROVIDERS, tiers=tuple(TIER_GBPS),
               root: Path | None = None, span: str = "region", regions: int = PLANNED_REGIONS) -> list[Candidate]:
    """Every priced type of each catalog at the highest of `tiers` its baseline reaches, its
    nodes `span` apart (one region, `regions` of them, or over the internet): the types with a
    GPU, or with none when `accel` is the CPU (`accel` None: each type's own GPUs)."""
    gpus = accel.gpus if accel is not None else 1
    found = []
    for provider in providers:
        catalog = load_catalog(provider, None, root)
        extras = sum(catalog.per_node_extras.values())
        placed: dict[str, str] = {}
        for tier in sorted(tiers, key=TIER_GBPS.get):
            for machine in catalog.qualifying(TIER_GBPS[tier], gpus):
                placed[machine.name] = tier
        for name, tier in sorted(placed.items()):
            found += [Candidate(provider, catalog.types[name], tier, n, extras, span=span, regions=regions)
                      for n in nodes]
    return found


def link_candidates(gbps: list[float], nodes: range) -> list[Candidate]:
    """Machines the catalogs do not hold (rented nodes, the seed's 1 vs 10 Gbit/s): a link of
    `gbps` each, no published flow cap, no price, at the highest tier it reaches, and one of the
    seed's GPUs (`OUTSIDE_CATALOG_GPU`) unless an accelerator is forced."""
    found = []
    for rate in gbps:
        if not 0 < rate < math.inf:
            raise ConfigError(f"--link must be a positive rate in Gbit/s, not {rate!r}")
        tier = max((t for t, g in TIER_GBPS.items() if g <= rate), key=TIER_GBPS.get, default="1g")
        link = MachineType(f"{rate:g} Gbit/s link", rate, rate, 0, 0.0, gpus=1, gpu_kind=OUTSIDE_CATALOG_GPU)
        found += [Candidate("link", link, tier, n) for n in nodes]
    return found


def rank(predictions: list[Prediction], by: str = "time") -> list[Prediction]:
    """Fastest first (`time`), or cheapest first (`cost`); the other breaks ties. Steps within
    1% of each other count as the same time: the model is not that precise, the price is."""
    if by not in ("time", "cost"):
        raise ConfigError(f"--by must be time or cost, not {by!r}")

    def cost(p: Prediction) -> float:
        return p.dollars if p.dollars is not None else math.inf

    def time(p: Prediction) -> int:
        return round(math.log(max(p.step_s, 1e-9)) / math.log(1.01))

    key = (lambda p: (time(p), cost(p))) if by == "time" else (lambda p: (cost(p), p.step_s))
    return sorted(predictions, key=key)


def plan(job: Job, accel: Accelerator | None, traffic: ModelTraffic, cands: list[Candidate],
         by: str = "time", auto_periodic: bool = False) -> list[Prediction]:
    """Every candidate with a sourced figure predicted and ranked (`accel` on every node, or
    None for each machine's own); the others are `unranked`'s."""
    return rank([predict(job, accel, traffic, c, auto_periodic) for c in cands
                 if node_accelerator(c.machine, accel) is not None], by)


@dataclass(frozen=True)
class Unranked:
    """A machine type left out of the ranking: no sourced figure for what computes on it."""

    provider: str
    machine: MachineType
    reason: str

    def to_dict(self) -> dict:
        return {"provider": self.provider, "machine": self.machine.name, "gpus": self.machine.gpus,
                "gpu_kind": self.machine.gpu_kind, "reason": self.reason}


def unranked(cands: list[Candidate], accel: Accelerator | None = None) -> list[Unranked]:
    """The candidates' machine types `plan` leaves out, once each, and why: never ranked on a
    guessed figure."""
    found: dict[tuple[str, str], Unranked] = {}
    for c in cands:
        if node_accelerator(c.machine, accel) is None:
            found.setdefault((c.provider, c.machine.name),
                             Unranked(c.provider, c.machine, missing_figure(c.machine)))
    return list(found.values())
