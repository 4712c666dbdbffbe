"""The job `fatpipe plan` prices: what one step computes per node, and what each link carries.

Pure arithmetic on published figures, before anything is deployed:

- compute: the node's accelerators (by default the machine type's own GPUs, `infra.accelerators`)
  at their sourced tokens/s for GPT-2 124M, scaled to another model by parameter count
  (training compute ~ 6 x params x tokens, so tokens/s ~ 1 / params);
- the link: a machine type's **baseline** bandwidth from its catalog (never the burst), capped
  by what the planned flows can carry (AWS caps one TCP flow; gloo opens one flow per peer,
  NCCL's socket transport as many as the tier's profile sets) and, for nodes in different
  regions or reached over the internet, by the provider's egress cap;
- the traffic: a ring all-reduce of the gradient over the N nodes sends 2 x (N-1)/N x bytes per
  node. A node of G GPUs runs G ranks, which sum their gradients over the node's own path first
  (`IN_NODE_GBPS`): the private link carries the ring of N nodes, not of N x G ranks.

The comm method, its exposed share and the step time come from the trainer's own comm=auto
model, applied by `ops.plan.plan` (the model layer imports no trainer, docs/ARCHITECTURE.md, "Layers").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# What computes on a node lives in `infra.accelerators`; its names are imported from here too.
from .accelerators import ACCELERATORS as ACCELERATORS
from .accelerators import REFERENCE_PARAMS as REFERENCE_PARAMS
from .accelerators import Accelerator
from .accelerators import accelerator as accelerator
from .catalog import MachineType
from .clusters import CLUSTER_MODELS
from .errors import ConfigError
from .netlimits import NO_PUBLISHED_CAPS, NetworkLimits
from .tiers import NCCL_SOCKETS

# llm.c's GPT-2 124M batch: 0.5M tokens per optimizer step, shared by every node.
DEFAULT_TOKENS_PER_STEP = 524_288


@dataclass(frozen=True)
class Job:
    """A training job: the model's size, how many tokens, how many per optimizer step."""

    params: int
    tokens: int  # to train on, in all
    tokens_per_step: int = DEFAULT_TOKENS_PER_STEP  # global batch, shared by every node
    warmup_steps: int | None = None  # LR warm-up (PowerSGD sends plain until then); None: the trainer's

    def __post_init__(self):
        for name in ("params", "tokens", "tokens_per_step"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"job: {name} must be a positive integer, not {value!r}")

    @property
    def steps(self) -> int:
        return math.ceil(self.tokens / self.tokens_per_step)

    @property
    def grad_bytes(self) -> int:
        return 4 * self.params  # float32 gradients, as DDP's buckets hold them

    def compute_s(self, accel: Accelerator, nodes: int, machine: MachineType | None = None) -> float:
        """One step's compute on each node: its share of the batch at its tokens/s."""
        return self.tokens_per_step / nodes / accel.node_tokens_per_s(self.params, machine)


# The GPUs inside a node reduce over NVLink or PCIe, not over the private link, and that sum is
# not counted: its path is faster than the link. The slowest, PCIe 3.0 x16 (g4dn's T4s), carries
# 15.75 GB/s a direction, 126 Gbit/s, above every link of the shipped catalogs' GPU types (100 at
# most); PCIe 4.0 x16 (g5, g6, g6e) 252, above the 160 that 16 NCCL flows of 10 carry on AWS;
# NVLink (p4d, p5) 600-900 GB/s.
IN_NODE_GBPS = 126.0


def ring_allreduce_bytes(grad_bytes: int, nodes: int) -> float:
    """Bytes each node sends (and receives) in a ring all-reduce over `nodes` nodes (its GPUs
    having summed theirs inside it): 2 x (N-1)/N x the message."""
    return 2 * (nodes - 1) / nodes * grad_bytes if nodes > 1 else 0.0


# -- the link -------------------------------------------------------------------------------------

def network_of(provider: str) -> NetworkLimits:
    """The published network limits of `provider` (its cluster model's, infra/netlimits.py)."""
    model = CLUSTER_MODELS.get(provider)
    return model.network if model is not None else NO_PUBLISHED_CAPS


def flow_cap_gbps(provider: str, machine: MachineType, span: str = "region") -> float | None:
    """The most one TCP flow carries between two nodes of this type; None: no published cap.
    No placement group spans regions or the internet."""
    return network_of(provider).flow_cap(machine, span)


def egress_cap_gbps(provider: str, machine: MachineType, span: str = "region") -> float | None:
    """What all of a node's flows together carry out of its region; None: no published cap."""
    return network_of(provider).egress_cap(machine, span)


def flows_per_peer(accel: Accelerator, tier: str, provider: str = "") -> int:
    """Flows one node opens to its ring neighbour: gloo (CPU) one; NCCL its sockets (the
    provider's own count where NCCL picks it itself, else the tier's profile)."""
    if accel.gpus == 0:
        return 1
    own = network_of(provider).nccl_flows
    if own is not None:
        return own
    threads, sockets = NCCL_SOCKETS[tier]
    return threads * sockets


@dataclass(frozen=True)
class Link:
    """What a node pair sustains: the baseline, capped by the flows the job opens."""

    gbps: float  # what the all-reduce gets
    baseline_gbps: float
    flow_cap_gbps: float | None  # the cap of all the flows together (and egress); None: none published
    burst_only: bool  # the advertised rate is mostly burst: baseline under half of it
    tier_unreachable: bool  # the planned flows cannot carry the tier's rate


def plan_link(provider: str, machine: MachineType, accel: Accelerator, tier: str,
              tier_gbps: float, span: str = "region") -> Link:
    """The link a job gets between two nodes of `machine` at `tier` (baseline, never burst),
    its ring's traffic staying in one region or crossing regions or the internet (`span`)."""
    if machine.baseline_gbps is None:
        raise ConfigError(f"{provider} {machine.name}: the catalog has no baseline bandwidth")
    baseline = machine.baseline_gbps
    one_flow = flow_cap_gbps(provider, machine, span)
    caps = [c for c in (one_flow * flows_per_peer(accel, tier, provider) if one_flow is not None else None,
                        egress_cap_gbps(provider, machine, span)) if c is not None]
    cap = min(caps) if caps else None
    gbps = min(baseline, cap) if cap is not None else baseline
    burst_only = bool(machine.peak_gbps) and baseline < 0.5 * machine.peak_gbps
    return Link(gbps, baseline, cap, burst_only, cap is not None and cap < tier_gbps)
